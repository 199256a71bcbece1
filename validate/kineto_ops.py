"""Measured op times out of a PyTorch profiler (Kineto) trace, for `sim calibrate ops`.

A trace recorded with ``torch.profiler.profile(record_shapes=True)`` and exported with
``export_chrome_trace`` holds, per aten op, a ``cpu_op`` span whose ``args["Input Dims"]`` and
``args["Input type"]`` give its operands, and, on a GPU, the ``kernel`` spans it launched,
linked to it by ``args["External id"]``. Each op of a kind the roofline prices becomes one
`ProfileRow`: its FLOPs and bytes from the operand shapes (the zoo's formulas: 2·m·n·k per
GEMM, element counts for element-wise ops), its time the sum of its kernels (GPU) or its span
(a CPU trace, which has no kernels). Identical (kind, shape) ops are merged into one row at
their median time, as `sim profile` reports them.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Any

from trainsim.errors import TraceError
from trainsim.validate.profile_db import ProfileDB, ProfileRow
from trainsim.validate.trace_import import chrome_events

GEMMS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
"""Matrix products, 2·[b·]m·n·k FLOPs from the two matrix operands: kind "matmul", or
"attention_score" (the batched-GEMM class) when batched."""
ATTENTION = {"aten::_scaled_dot_product_flash_attention": "flash_attention",
             "aten::_scaled_dot_product_efficient_attention": "flash_attention",
             "aten::_scaled_dot_product_cudnn_attention": "flash_attention",
             "aten::_flash_attention_forward": "flash_attention"}
"""Fused attention kernels: 4·b·h·s_q·s_kv·d FLOPs from Q [b, h, s_q, d] and K [b, h, s_kv, d]."""
ELEMENTWISE = {"aten::native_layer_norm": "layernorm", "aten::_softmax": "softmax",
               "aten::gelu": "gelu", "aten::add": "elementwise", "aten::mul": "elementwise",
               "aten::silu": "elementwise", "aten::native_dropout": "dropout",
               "aten::embedding": "embedding"}
"""Memory-bound ops: bytes = inputs read + one output of the first input's size written."""
FLOPS_PER_ELEMENT = {"layernorm": 8.0, "softmax": 5.0, "gelu": 10.0, "elementwise": 1.0,
                     "dropout": 2.0, "embedding": 0.0}
"""Rough FLOPs per element, as the zoo counts them (they rarely bind: these ops are
memory-bound)."""
TYPE_BYTES = {"c10::BFloat16": 2, "c10::Half": 2, "float": 4, "double": 8, "c10::Float8_e4m3fn": 1,
              "c10::Float8_e5m2": 1, "long int": 8, "int": 4, "bool": 1}


def _elements(dims: Any) -> int:
    return math.prod(int(d) for d in dims) if isinstance(dims, list) and dims else 0


def _operand_bytes(dims: list[Any], types: list[Any]) -> float:
    return float(sum(_elements(d) * TYPE_BYTES.get(str(t), 2) for d, t in zip(dims, types)
                     if isinstance(d, list)))


def _work(name: str, dims: list[Any], types: list[Any]) -> tuple[str, tuple[int, ...], float,
                                                                  float] | None:
    """(kind, shape, FLOPs, bytes) of one aten op, or None when its operands do not say."""
    width = TYPE_BYTES.get(str(types[0]), 2) if types else 2
    if name in GEMMS:
        mats = [d for d in dims if isinstance(d, list) and len(d) >= 2]
        if len(mats) < 2:
            return None
        a, b = mats[-2], mats[-1]
        batch = math.prod(int(x) for x in a[:-2]) if len(a) > 2 else 1
        m, k, n = int(a[-2]), int(a[-1]), int(b[-1])
        if int(b[-2]) != k:
            return None
        shape = (m, n, k) if batch == 1 else (batch, m, n, k)
        return ("attention_score" if batch > 1 else "matmul", shape, 2.0 * batch * m * n * k,
                _operand_bytes(dims, types) + width * batch * m * n)
    if name in ATTENTION:
        if len(dims) < 3 or not all(isinstance(d, list) and len(d) == 4 for d in dims[:3]):
            return None
        (b, h, s_q, d), (_, _, s_kv, _) = dims[0], dims[1]
        flops = 4.0 * b * h * s_q * s_kv * d
        return ("flash_attention", (b * h, s_q, s_kv, d), flops,
                _operand_bytes(dims[:3], types[:3]) + width * b * h * s_q * d)
    if name in ELEMENTWISE:
        n = _elements(dims[0]) if dims else 0
        if n <= 0:
            return None
        kind = ELEMENTWISE[name]
        return (kind, (n,), FLOPS_PER_ELEMENT[kind] * n, _operand_bytes(dims, types) + width * n)
    return None


def kineto_profile(data: Any, where: str = "trace") -> ProfileDB:
    """The shaped aten ops of a Kineto trace as a profile database (module docstring).

    Raises:
        TraceError: not a Chrome trace, or no op with recorded shapes (record_shapes=True).
    """
    events = chrome_events(data, where)
    kernel_us: dict[Any, float] = defaultdict(float)
    for e in events:
        if e.get("cat") == "kernel" and e.get("ph") == "X":
            ext = (e.get("args") or {}).get("External id")
            if ext is not None:
                kernel_us[ext] += float(e.get("dur", 0.0))
    gpu = bool(kernel_us)
    times: dict[tuple[str, tuple[int, ...], float, float], list[float]] = defaultdict(list)
    for e in events:
        if e.get("cat") != "cpu_op" or e.get("ph") != "X":
            continue
        args = e.get("args") or {}
        dims, types = args.get("Input Dims"), args.get("Input type") or []
        if not isinstance(dims, list):
            continue
        work = _work(str(e.get("name", "")), dims, list(types))
        if work is None:
            continue
        us = kernel_us.get(args.get("External id"), 0.0) if gpu else float(e.get("dur", 0.0))
        if us > 0:
            times[work].append(us * 1e-6)
    if not times:
        raise TraceError(f"{where}: no aten op with recorded shapes and a time (record the "
                         "trace with torch.profiler.profile(record_shapes=True))")
    rows = tuple(ProfileRow(kind=kind, shape=shape, flops=flops, bytes_moved=moved,
                            time_s=statistics.median(ts), repeats=len(ts))
                 for (kind, shape, flops, moved), ts in sorted(times.items()))
    return ProfileDB(meta={"device": "cuda" if gpu else "cpu", "command": f"Kineto {where}"},
                     rows=rows)


__all__ = ["ATTENTION", "ELEMENTWISE", "GEMMS", "kineto_profile"]
