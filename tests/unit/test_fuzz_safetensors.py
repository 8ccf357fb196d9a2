"""Fuzzing the two safetensors header parsers against each other and against the reference.

The converter's parser (models/safetensors_check.py) and the runtime's copy
(app/engine/safetensors_header.py) see the same bytes: valid files written here, then truncated,
bit-flipped, given a lying header field, a wrong header length, trailing bytes or a duplicated
key. Properties:

* each raises only its own error type (ModelError / EngineError), never anything else;
* both give the same verdict and, when they accept, the same entries;
* whatever they accept, the reference implementation (huggingface/safetensors, Rust) accepts
  too, and every tensor the converter reads equals the reference's decoding of the same bytes;
* a file the writer produced, even with flipped data bytes, is accepted; a truncated file or
  one with trailing bytes never is.
"""

from __future__ import annotations

import json
import struct
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.engine.errors import EngineError
from app.engine.safetensors_header import parse_header as runtime_parse
from models.errors import ModelError
from models.hf_source import SafetensorsFile
from models.safetensors_check import DTYPE_SIZES
from models.safetensors_check import parse_header as converter_parse

torch = pytest.importorskip("torch")
from safetensors.torch import load as reference_load  # noqa: E402

from tests.unit._fuzz import fuzz_settings  # noqa: E402

STATS: Counter = Counter()  # examples per mutation kind and verdict, printed by the last test
FUZZ = fuzz_settings(30)
NAMES = ["a", "model.norm.weight", "w.codes", "x.y", "é", ""]

# ---- writing files ----------------------------------------------------------------------------
tensor_spec = st.tuples(st.sampled_from(sorted(DTYPE_SIZES)),
                        st.lists(st.integers(0, 4), min_size=0, max_size=3))


@st.composite
def valid_files(draw) -> tuple[dict, bytes]:
    """(header dict, data bytes) of a well-formed file: tensors laid out in a random order."""
    names = draw(st.lists(st.sampled_from(NAMES), min_size=0, max_size=4, unique=True))
    specs = {n: draw(tensor_spec) for n in names}
    order = draw(st.permutations(names))
    header, at = {}, 0
    for n in order:
        dt, shape = specs[n]
        nbytes = int(np.prod(shape, dtype=np.int64)) * DTYPE_SIZES[dt]
        header[n] = {"dtype": dt, "shape": shape, "data_offsets": [at, at + nbytes]}
        at += nbytes
    if draw(st.booleans()):
        header["__metadata__"] = {"format": "pt"}
    data = draw(st.binary(min_size=at, max_size=at))
    return header, data


def encode(header: dict, data: bytes, pad: int = 0) -> bytes:
    raw = json.dumps(header).encode() + b" " * pad
    return struct.pack("<Q", len(raw)) + raw + data


odd_values = st.one_of(
    st.integers(-(2**65), 2**65), st.floats(allow_nan=True), st.booleans(), st.none(), st.text(max_size=4),
    st.lists(st.integers(-3, 2**64 + 3), max_size=4), st.sampled_from(["F32", "BF16", "U16", "f32", "Q4"]),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2))


KINDS = ["none", "truncate", "bitflip", "lie", "hlen", "trailing", "duplicate"]


@st.composite
def mutated_files(draw, kind: str) -> tuple[str, bytes]:
    header, data = draw(valid_files())
    good = encode(header, data, pad=draw(st.integers(0, 7)))
    if kind == "truncate":
        return kind, good[: draw(st.integers(0, len(good) - 1))]
    if kind == "bitflip":
        buf = bytearray(good)
        for _ in range(draw(st.integers(1, 3))):
            i = draw(st.integers(0, len(buf) - 1))
            buf[i] ^= 1 << draw(st.integers(0, 7))
        return kind, bytes(buf)
    if kind == "lie":
        tensors = [n for n in header if n != "__metadata__"]
        if not tensors:
            return "none", good
        entry = header[draw(st.sampled_from(tensors))]
        field = draw(st.sampled_from(["dtype", "shape", "data_offsets", "drop"]))
        if field == "drop":
            del entry[draw(st.sampled_from(sorted(entry)))]
        else:
            entry[field] = draw(st.one_of(odd_values, st.lists(odd_values, max_size=3)))
        return kind, encode(header, data)
    if kind == "hlen":
        return kind, struct.pack("<Q", draw(st.integers(0, 2**64 - 1))) + good[8:]
    if kind == "trailing":
        return kind, good + draw(st.binary(min_size=1, max_size=9))
    if kind == "duplicate":
        if not header:
            return "none", good
        raw = json.dumps(header)
        raw_b = (raw[:-1] + ", " + raw[1:]).encode()  # every key twice
        return kind, struct.pack("<Q", len(raw_b)) + raw_b + data
    return kind, good


# ---- the properties ---------------------------------------------------------------------------
def _verdict(parse, err, path):
    try:
        return parse(path)
    except err:
        return None


def _same(e1, e2) -> bool:
    return (e1.name, e1.dtype, e1.shape, e1.begin, e1.end) == (e2.name, e2.dtype, e2.shape, e2.begin, e2.end)


def _oracle_bytes(t) -> bytes:
    return t.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("mutation", KINDS)
@FUZZ
@given(data=st.data())
def test_parsers_agree_with_each_other_and_with_the_reference(mutation, data):
    kind, blob = data.draw(mutated_files(mutation))
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "model.safetensors"
        path.write_bytes(blob)
        conv = _verdict(converter_parse, ModelError, path)
        run = _verdict(runtime_parse, EngineError, path)
        STATS[f"{kind}:{'accepted' if conv else 'refused'}"] += 1
        assert (conv is None) == (run is None), f"{kind}: converter {conv is not None}, runtime {run is not None}"
        if kind in ("truncate", "trailing"):
            assert conv is None, f"{kind}: a damaged file was accepted"
        if kind == "none":
            assert conv is not None, "a well-formed file was refused"
        if conv is None:
            return
        assert list(conv.tensors) == list(run.tensors)
        assert all(_same(conv.tensors[n], run.tensors[n]) for n in conv.tensors)
        ref = reference_load(blob)  # must not raise: we are never more lenient than the reference
        assert set(ref) == set(conv.tensors)
        sf = SafetensorsFile(path)
        for n, e in conv.tensors.items():
            assert tuple(ref[n].shape) == e.shape
            assert _oracle_bytes(ref[n]) == blob[e.begin:e.end], n
            want = ref[n].float().numpy() if ref[n].is_floating_point() else ref[n].numpy()
            if e.dtype == "F64" and (np.isinf(want) & np.isfinite(ref[n].numpy())).any():
                with pytest.raises(ModelError, match=rf"tensor {n!r} \(F64\) has values beyond the float32"):
                    sf.read(n)  # f64 -> f32 would turn finite values into inf: refused, not rounded
                continue
            got = sf.read(n)
            assert got.shape == want.shape
            np.testing.assert_array_equal(got, want, err_msg=n)
        del sf


@fuzz_settings(60)
@given(valid_files(), st.data())
def test_flipped_data_bytes_are_read_where_the_header_says(case, data):
    """A flip in the data region keeps the file valid: the changed bytes land in exactly the
    tensor whose offsets cover them (no tensor is read from the wrong place)."""
    header, payload = case
    if not payload:
        return
    i = data.draw(st.integers(0, len(payload) - 1))
    flipped = bytearray(payload)
    flipped[i] ^= 0xFF
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "model.safetensors"
        blob = encode(header, bytes(flipped))
        path.write_bytes(blob)
        h = converter_parse(path)
        base = h.data_start
        for n, e in h.tensors.items():
            orig = payload[e.begin - base:e.end - base]
            now = blob[e.begin:e.end]
            assert (orig != now) == (e.begin - base <= i < e.end - base), n
    STATS["dataflip:accepted"] += 1


# ---- each fault, named ------------------------------------------------------------------------
def _write(tmp_path, header, data=b"", raw=None) -> Path:
    p = tmp_path / "w.safetensors"
    p.write_bytes(raw if raw is not None else encode(header, data))
    return p


F32x2 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
DUP = b'{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'


@pytest.mark.parametrize("header, data, message", [
    ({"t": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}, bytes(8), r"tensor 't'.*begin <= end"),
    ({"t": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}}, bytes(8), r"tensor 't'.*begin <= end"),
    ({"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, bytes(8), r"truncated.*tensor 't'"),
    ({"t": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, bytes(8), r"tensor 't'.*needs 12 bytes"),
    ({"t": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, bytes(8), r"tensor 't'.*non-negative"),
    ({"t": {"dtype": "F32", "shape": [True, 2], "data_offsets": [0, 8]}}, bytes(8), r"tensor 't'.*non-negative"),
    ({"t": {"dtype": "F32", "shape": [2**40, 2**40, 0], "data_offsets": [0, 0]}}, b"", r"tensor 't'.*overflows"),
    ({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "u": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, bytes(12), r"tensor 'u'.*overlap tensor 't'"),
    ({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
      "u": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}, bytes(12), r"tensor 'u'.*belong to no tensor"),
    ({"t": F32x2}, bytes(12), r"4 bytes after the last tensor"),
    ({"t": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}}, bytes(8), r"tensor 't'.*unsupported dtype"),
    ({"t": {"dtype": "F32", "shape": [2]}}, bytes(8), r"tensor 't'.*lacks"),
    ({"__metadata__": {"k": 1}, "t": F32x2}, bytes(8), r"__metadata__"),
])
@pytest.mark.parametrize("parse, err", [(converter_parse, ModelError), (runtime_parse, EngineError)])
def test_each_fault_names_file_and_tensor(tmp_path, parse, err, header, data, message):
    p = _write(tmp_path, header, data)
    with pytest.raises(err, match=message) as e:
        parse(p)
    assert str(p) in str(e.value)


@pytest.mark.parametrize("raw, message", [
    (b"\x03\x00", r"not even the 8-byte header length"),
    (struct.pack("<Q", 200_000_000) + b"{}", r"above the 100000000-byte limit"),
    (struct.pack("<Q", 50) + b"{}", r"header says 50 header bytes"),
    (struct.pack("<Q", 4) + b"[1] ", r"not a JSON object"),
    (struct.pack("<Q", 3) + b"\xff{}", r"corrupted safetensors header"),
    (struct.pack("<Q", 0), r"corrupted safetensors header"),
    (struct.pack("<Q", len(DUP)) + DUP + bytes(8), r"'t' appears twice"),
])
@pytest.mark.parametrize("parse, err", [(converter_parse, ModelError), (runtime_parse, EngineError)])
def test_header_faults(tmp_path, parse, err, raw, message):
    with pytest.raises(err, match=message):
        parse(_write(tmp_path, None, raw=raw))


def test_zz_fuzz_statistics():
    """Not a check of its own: reports how many examples each mutation got (pytest -s)."""
    print("\nsafetensors fuzz examples:", dict(sorted(STATS.items())), "total", sum(STATS.values()))
