"""Plain-dict views of the hardware catalog and of a cluster, as `sim hw` prints them.

Kept beside the catalog so the Python API and the CLI describe hardware the same way.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from trainsim.hwmodels.cluster import Cluster
from trainsim.hwmodels.datafiles import unknown
from trainsim.hwmodels.gpus import GpuSpec, get_gpu, list_gpus
from trainsim.hwmodels.nodes import get_nic, get_node_type, list_nics, list_node_types
from trainsim.hwmodels.power import power_model


def catalog_gpus() -> list[GpuSpec]:
    """Every GPU type in the catalog, in catalog order."""
    return [get_gpu(n) for n in list_gpus()]


def describe_hardware(name: str) -> dict[str, Any]:
    """Every field of a GPU type (with its DVFS power model), node type or NIC, with sources.

    Raises:
        UnknownNameError: no GPU, node type or NIC of that name; lists close names.
    """
    lowered = name.strip().lower()
    if lowered in {n.lower() for n in list_gpus()}:
        gpu = get_gpu(name)
        data: dict[str, Any] = {"kind": "gpu", **gpu.to_dict()}
        pm = power_model(gpu)
        data["power_model"] = {
            "v_min_ratio": pm.v_min_ratio,
            "dynamic_power_max_w": pm.dynamic_power_max_w,
            "memory_bound_activity": pm.memory_bound_activity,
            "voltage_knee_mhz": pm.voltage_knee_mhz,
        }
        return data
    if lowered in {n.lower() for n in list_node_types()}:
        return dict(get_node_type(name).to_dict())
    if lowered in {n.lower() for n in list_nics()}:
        return dict(get_nic(name).to_dict())
    raise unknown("GPU, node type or NIC", name, [*list_gpus(), *list_node_types(), *list_nics()])


def describe_cluster(cluster: Cluster, spec: str) -> dict[str, Any]:
    """A cluster's size, fp16 peak (None where the devices have no fp16), price, node groups,
    links by kind and bandwidth, and its YAML form (`spec` is how the user wrote it)."""
    link_kinds = Counter((link.kind, link.bandwidth_bytes_per_s) for link in cluster.links())
    links = [{"kind": kind, "bandwidth_bytes_per_s": bw, "count": n}
             for (kind, bw), n in sorted(link_kinds.items())]
    peak_fp16 = cluster.peak_flops("fp16") or None  # None: no fp16 (a `cpu:N` cluster)
    return {
        "spec": spec,
        "num_nodes": cluster.num_nodes,
        "num_gpus": cluster.num_gpus,
        "peak_fp16_flops": peak_fp16,
        "price_per_hour_usd": cluster.price_per_hour_usd,
        "node_groups": cluster.describe(),
        "links": links,
        "yaml": cluster.to_dict(),
    }
