"""Length datasets: file formats, bad input, synthetic mixtures, max length, token batches."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import yaml

from trainsim.errors import DataFileError, SpecError, UnknownNameError
from trainsim.workloads import lengths as L
from trainsim.workloads.lengths import LengthDataset, Sample


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _ds(*sizes: int | tuple[int, int]) -> LengthDataset:
    samples = tuple(Sample(*s) if isinstance(s, tuple) else Sample(s) for s in sizes)
    return LengthDataset(name="toy", samples=samples, source="test")


# ---- text files -----------------------------------------------------------------------------


def test_text_single_counts_with_comments_and_blanks(tmp_path: Path) -> None:
    path = _write(tmp_path, "lens.txt", "# header comment\n12\n\n  7  # trailing\n2048\n")
    ds = L.read_lengths(path)
    assert ds.lengths().tolist() == [12, 7, 2048]
    assert ds.targets().tolist() == [0, 0, 0]
    assert not ds.encoder_decoder
    assert ds.name == "lens" and ds.source == str(path)


@pytest.mark.parametrize("sep", [",", " ", "\t", ", "])
def test_text_pairs(tmp_path: Path, sep: str) -> None:
    path = _write(tmp_path, "pairs", f"100{sep}5\n# c\n300{sep}40\n")
    ds = L.read_lengths(path)
    assert [(s.input_len, s.target_len) for s in ds.samples] == [(100, 5), (300, 40)]
    assert ds.encoder_decoder


@pytest.mark.parametrize(("text", "needle"), [
    ("12\nabc\n", "line 2: 'abc' is not a token count"),
    ("12\n0\n", "line 2: 0 is not a positive token count"),
    ("-5\n", "line 1: -5 is not a positive token count"),
    ("12.5\n", "line 1: '12.5' is not a token count"),
    ("20000000\n", "line 1: 20000000 tokens is more than"),
    ("10,0\n", "line 1: 0 is not a positive target token count"),
    ("10,x\n", "line 1: 'x' is not a target token count"),
    ("10\n20,3\n", "line 2: an input,target pair, but line 1 has a single count"),
    ("1 2 3\n", "line 1: '1 2 3' is neither a token count"),
])
def test_text_bad_values_name_file_and_line(tmp_path: Path, text: str, needle: str) -> None:
    path = _write(tmp_path, "bad.txt", text)
    with pytest.raises(SpecError) as err:
        L.read_lengths(path)
    message = str(err.value)
    assert str(path) in message and needle in message
    assert "\n" not in message


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n"])
def test_empty_files(tmp_path: Path, text: str) -> None:
    path = _write(tmp_path, "empty.txt", text)
    with pytest.raises(SpecError, match=r"empty\.txt: no samples"):
        L.read_lengths(path)


def test_missing_file_directory_and_unknown_suffix(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"nope\.txt: no such file"):
        L.read_lengths(tmp_path / "nope.txt")
    with pytest.raises(SpecError, match="is a directory"):
        L.read_lengths(tmp_path)
    with pytest.raises(SpecError, match=r"x\.json: unknown format '\.json'"):
        L.read_lengths(_write(tmp_path, "x.json", "[1]"))
    binary = tmp_path / "bin.txt"
    binary.write_bytes(b"\xff\xfe\x00\x01")
    with pytest.raises(SpecError, match=r"bin\.txt: not a UTF-8 text file"):
        L.read_lengths(binary)


# ---- CSV ------------------------------------------------------------------------------------


def test_csv_conventional_column_names(tmp_path: Path) -> None:
    path = _write(tmp_path, "d.csv", "task,input_len,target_len,score\nqa,10,2,0.5\nnli,30,1,0.7\n")
    ds = L.read_lengths(path)
    assert [(s.input_len, s.target_len) for s in ds.samples] == [(10, 2), (30, 1)]


def test_csv_only_numeric_column_and_explicit_columns(tmp_path: Path) -> None:
    path = _write(tmp_path, "d.csv", "task,n\nqa,10\nnli,30\n")
    assert L.read_lengths(path).lengths().tolist() == [10, 30]
    path = _write(tmp_path, "e.csv", "a,b,c\n1,2,3\n4,5,6\n")
    ds = L.read_lengths(path, column="c", target_column="a")
    assert [(s.input_len, s.target_len) for s in ds.samples] == [(3, 1), (6, 4)]
    # the length column by name wins over numeric guessing; "target" is picked up by default
    path = _write(tmp_path, "f.csv", "id,tokens,target\n1,50,4\n2,60,5\n")
    assert [(s.input_len, s.target_len) for s in L.read_lengths(path).samples] == [
        (50, 4), (60, 5)]


@pytest.mark.parametrize(("text", "kwargs", "needle"), [
    ("a,b\n1,2\n", {}, "cannot tell which column holds the lengths (numeric columns: a, b)"),
    ("len\n5\n", {"column": "tokens"}, "no column 'tokens' (columns: len)"),
    ("len\n5\n", {"target_column": "tgt"}, "no column 'tgt'"),
    ("10,20\n30,40\n", {}, "line 1: the first row must be a header"),
    ("length\n5\nfive\n", {}, "line 3 column 'length': 'five' is not a token count"),
    ("length,target_len\n5,1\n6\n", {}, "line 3: 1 fields, but the header has 2"),
    ("length,target_len\n5,0\n", {}, "line 2 column 'target_len': 0 is not a positive target"),
    ("length\n", {}, "no samples"),
    ("", {}, "no samples"),
])
def test_csv_bad_input(tmp_path: Path, text: str, kwargs: dict[str, str], needle: str) -> None:
    path = _write(tmp_path, "bad.csv", text)
    with pytest.raises(SpecError) as err:
        L.read_lengths(path, **kwargs)
    assert str(path) in str(err.value) and needle in str(err.value)


# ---- Parquet --------------------------------------------------------------------------------


def test_parquet_round_trip_and_errors(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"name": ["a", "b", "c"], "length": [5, 700, 33],
                             "target_len": [1, 2, 3]}), path)
    ds = L.read_lengths(path)
    assert [(s.input_len, s.target_len) for s in ds.samples] == [(5, 1), (700, 2), (33, 3)]
    assert L.read_lengths(path, column="target_len", target_column="length").lengths().tolist() \
        == [1, 2, 3]

    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"tokens": [5.0, -1.0]}), bad)
    with pytest.raises(SpecError, match=r"bad\.parquet row 2 column 'tokens': -1 is not a posit"):
        L.read_lengths(bad)
    missing = tmp_path / "missing.parquet"
    pq.write_table(pa.table({"tokens": [5, None]}), missing)
    with pytest.raises(SpecError, match=r"missing\.parquet row 2: missing value in column"):
        L.read_lengths(missing)
    junk = _write(tmp_path, "junk.parquet", "not parquet")
    with pytest.raises(SpecError, match=r"junk\.parquet: not a readable Parquet file"):
        L.read_lengths(junk)


def test_parquet_without_pyarrow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_pyarrow(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith("pyarrow"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    path = _write(tmp_path, "d.parquet", "x")
    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    with pytest.raises(SpecError, match="^reading Parquet needs pyarrow: pip install pyarrow$"):
        L.read_lengths(path)


# ---- tokenizer ------------------------------------------------------------------------------


@pytest.fixture
def tokenizer_file(tmp_path: Path) -> Path:
    """A tiny word-level tokenizer.json (whitespace split), built in memory."""
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[UNK]": 0, "the": 1, "cat": 2, "sat": 3, "on": 4, "mat": 5, "yes": 6}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.enable_truncation(max_length=2)  # must not leak into the counts
    path = tmp_path / "tok" / "tokenizer.json"
    path.parent.mkdir()
    tok.save(str(path))
    return path


def test_tokenize_txt_and_folder(tmp_path: Path, tokenizer_file: Path) -> None:
    text = _write(tmp_path, "s.txt", "the cat sat on the mat\n\ncat dog\n# not a comment here\n")
    ds = L.tokenize_lengths(text, tokenizer_file)
    assert ds.lengths().tolist() == [6, 2, 5]  # '#' lines are text; truncation disabled
    assert ds.targets().tolist() == [0, 0, 0]
    assert L.tokenize_lengths(text, tokenizer_file.parent).lengths().tolist() == [6, 2, 5]
    assert str(tokenizer_file) in ds.source


def test_tokenize_jsonl_with_targets(tmp_path: Path, tokenizer_file: Path) -> None:
    rows = [{"q": "the cat sat", "a": "yes"}, {"q": "on the mat", "a": "the cat sat on"}]
    path = _write(tmp_path, "s.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n")
    ds = L.tokenize_lengths(path, tokenizer_file, field="q", target_field="a")
    assert [(s.input_len, s.target_len) for s in ds.samples] == [(3, 1), (3, 4)]
    assert ds.encoder_decoder


@pytest.mark.parametrize(("text", "kwargs", "needle"), [
    ('{"text": "cat"}\nnot json\n', {}, "line 2: not valid JSON"),
    ('[1, 2]\n', {}, "line 1: not a JSON object"),
    ('{"body": "cat"}\n', {}, "line 1: no field 'text' (fields: body)"),
    ('{"text": 3}\n', {}, "line 1: field 'text' is not a string"),
    ('{"text": "cat", "t": ""}\n', {"target_field": "t"},
     "line 1 field 't': tokenizes to no tokens"),
    ("", {}, "no samples"),
])
def test_tokenize_bad_text(tmp_path: Path, tokenizer_file: Path, text: str,
                           kwargs: dict[str, str], needle: str) -> None:
    path = _write(tmp_path, "bad.jsonl", text)
    with pytest.raises(SpecError) as err:
        L.tokenize_lengths(path, tokenizer_file, **kwargs)
    assert str(path) in str(err.value) and needle in str(err.value)


def test_tokenize_bad_tokenizer(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    text = _write(tmp_path, "s.txt", "the cat\n")
    with pytest.raises(SpecError, match=r"tokenizer .*nowhere\.json: no such file"):
        L.tokenize_lengths(text, tmp_path / "nowhere.json")
    with pytest.raises(SpecError, match=r"tokenizer .*tokenizer\.json: no such file"):
        L.tokenize_lengths(text, tmp_path)  # a folder without tokenizer.json
    corrupt = _write(tmp_path, "corrupt.json", '{"version": "1.0", "model": 5}')
    with pytest.raises(SpecError, match=r"corrupt\.json: not a valid tokenizer\.json") as err:
        L.tokenize_lengths(text, corrupt)
    assert "\n" not in str(err.value)
    with pytest.raises(SpecError, match=r"x\.csv: unknown format"):
        L.tokenize_lengths(_write(tmp_path, "x.csv", "a\n"), corrupt)


def test_tokenize_without_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_tokenizers(name: str, *args: object, **kwargs: object) -> object:
        if name == "tokenizers":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_tokenizers)
    with pytest.raises(SpecError, match="pip install tokenizers$"):
        L.tokenize_lengths(_write(tmp_path, "s.txt", "a\n"), tmp_path / "t.json")


# ---- synthetic mixtures ---------------------------------------------------------------------


def test_mixtures_listed_and_unknown_name() -> None:
    assert {"flan", "uniform-long"} <= set(L.list_mixtures())
    with pytest.raises(UnknownNameError, match="unknown length mixture 'flna'.*flan"):
        L.synthetic("flna")
    with pytest.raises(SpecError, match="samples=0"):
        L.synthetic("flan", samples=0)


def test_synthetic_reproducible_per_seed() -> None:
    a = L.synthetic("flan", samples=2000, seed=3)
    b = L.synthetic("FLAN", samples=2000, seed=3)
    c = L.synthetic("flan", samples=2000, seed=4)
    assert a.samples == b.samples
    assert a.samples != c.samples
    assert "seed=3" in a.source and "flan" in a.source
    assert all(s.input_len >= 1 and s.target_len >= 1 for s in a.samples)
    assert all(isinstance(s.input_len, int) for s in a.samples[:10])


@pytest.mark.parametrize("name", ["flan", "flan-zsopt", "uniform-long"])
def test_synthetic_percentiles_match_yaml(name: str) -> None:
    mixture = L.get_mixture(name)
    ds = L.synthetic(name, samples=100_000, seed=0)
    inputs, targets = ds.lengths(), ds.targets()
    checked = 0
    for key, want in mixture.expected.items():
        kind, pct = key.split("_p")
        data = inputs if kind == "input" else targets
        got = float(np.percentile(data, float(pct)))
        assert got == pytest.approx(want, rel=0.04, abs=1.0), key
        checked += 1
    assert checked >= 3
    assert inputs.max() <= mixture.max_input
    assert ds.encoder_decoder == (mixture.max_target > 0)


def test_flan_has_a_long_tail_and_uniform_long_is_long() -> None:
    flan = L.synthetic("flan", samples=50_000, seed=1).lengths()
    assert np.median(flan) < 500 and 2048 < flan.max() <= 4096
    assert 0.005 < float(np.mean(flan > 2048)) < 0.05
    long = L.synthetic("uniform-long", samples=50_000, seed=1)
    assert np.median(long.lengths()) > 1500 and not long.encoder_decoder


def test_yaml_every_parameter_sourced_and_weights_sum_to_one() -> None:
    root = Path(L.__file__).parent / "data" / "length_mixtures.yaml"
    data = yaml.safe_load(root.read_text())
    for mixture in data["mixtures"].values():
        assert mixture["max_input"]["source"] and mixture["expected"]["source"]
        total = 0.0
        for comp in mixture["components"].values():
            total += comp["weight"]["value"]
            assert comp["weight"]["source"].strip()
            for part in ("input", "target"):
                if part in comp:
                    assert comp[part]["source"].strip()
        assert total == pytest.approx(1.0)


def test_parse_mixtures_rejects_bad_files() -> None:
    good = yaml.safe_load((Path(L.__file__).parent / "data" / "length_mixtures.yaml").read_text())
    bad = json.loads(json.dumps(good))
    bad["mixtures"]["flan"]["components"]["t0-zs"]["weight"]["value"] = 0.5
    with pytest.raises(DataFileError, match=r"mixtures\.flan\.components: weights sum to"):
        L.parse_mixtures(bad)
    bad = json.loads(json.dumps(good))
    del bad["mixtures"]["flan"]["components"]["cot-zs"]["input"]["source"]
    with pytest.raises(DataFileError, match=r"components\.cot-zs\.input"):
        L.parse_mixtures(bad)
    bad = json.loads(json.dumps(good))
    bad["mixtures"]["flan"]["components"]["cot-zs"]["input"]["dist"] = "gamma"
    with pytest.raises(DataFileError, match=r"cot-zs\.input\.dist='gamma'"):
        L.parse_mixtures(bad)


# ---- maximum length -------------------------------------------------------------------------


def test_fit_max_len_truncate() -> None:
    ds = _ds((100, 10), (3000, 700), (50, 5))
    out = L.fit_max_len(ds, 2048)
    assert [(s.input_len, s.target_len) for s in out.samples] == [(100, 10), (2048, 700),
                                                                   (50, 5)]
    out = L.fit_max_len(ds, 2048, max_target_len=512)
    assert out.samples[1] == Sample(2048, 512)
    assert "1 samples truncated" in out.source
    assert L.fit_max_len(ds, 4096) is ds


def test_fit_max_len_reject() -> None:
    ds = _ds(100, 50, 3000, 5000)
    with pytest.raises(SpecError) as err:
        L.fit_max_len(ds, 2048, policy="reject")
    message = str(err.value)
    assert "sample 2 " in message and "3000 input tokens" in message and "2048" in message
    assert "--on-long truncate" in message
    with pytest.raises(SpecError, match="sample 0 .* 600 target tokens.* 512"):
        L.fit_max_len(_ds((10, 600)), 2048, policy="reject", max_target_len=512)
    assert L.fit_max_len(ds, 5000, policy="reject") is ds
    with pytest.raises(SpecError, match="--on-long 'clip' must be one of truncate, reject"):
        L.fit_max_len(ds, 2048, policy="clip")
    with pytest.raises(SpecError, match="--max-len 0"):
        L.fit_max_len(ds, 0)


# ---- global batches -------------------------------------------------------------------------


def test_iteration_batches_respect_budget_and_cover_every_sample() -> None:
    ds = _ds(*[(i, i % 7) for i in range(1, 61)])  # distinct samples
    size = {s: s.input_len + s.target_len for s in ds.samples}
    budget = 200
    batches = L.iteration_batches(ds, budget, iterations=40, seed=5)
    assert len(batches) == 40
    seen: Counter[Sample] = Counter()
    epochs = 0
    for batch in batches:
        assert batch and sum(size[s] for s in batch) <= budget
        assert len(set(batch)) == len(batch)
        seen.update(batch)
        if len(seen) == len(ds.samples) and all(v == 1 for v in seen.values()):
            epochs += 1
            seen.clear()
        else:
            assert all(v == 1 for v in seen.values()), "a sample repeated before the pass ended"
    assert epochs >= 2
    # greedy fill: a batch stops only when the next sample would not fit (or the pass ends)
    flat = [s for b in batches for s in b]
    assert flat[: len(ds.samples)] != list(ds.samples)  # shuffled
    assert L.iteration_batches(ds, budget, iterations=40, seed=5) == batches
    assert L.iteration_batches(ds, budget, iterations=40, seed=6) != batches


def test_iteration_batches_greedy_fill() -> None:
    ds = _ds(*([100] * 10))
    batches = L.iteration_batches(ds, 250, iterations=6, seed=0)
    assert [len(b) for b in batches] == [2, 2, 2, 2, 2, 2]
    batches = L.iteration_batches(ds, 300, iterations=4, seed=0)  # a budget met exactly
    assert [len(b) for b in batches] == [3, 3, 3, 1]  # the pass ends with a short batch
    batches = L.iteration_batches(ds, 10_000, iterations=2, seed=0)
    assert [len(b) for b in batches] == [10, 10]


def test_iteration_batches_budget_below_longest_sample() -> None:
    ds = _ds(*([10] * 17), (2000, 48), 10)
    with pytest.raises(SpecError) as err:
        L.iteration_batches(ds, 100, iterations=3)
    assert str(err.value) == ("--tokens-per-batch 100 is smaller than sample 17 (2048 tokens): "
                              "no batch can hold it")
    with pytest.raises(SpecError, match="--iterations 0"):
        L.iteration_batches(ds, 4096, iterations=0)
