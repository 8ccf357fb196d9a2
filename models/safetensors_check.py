"""A strict safetensors header parser for the converter (models/hf_source.py).

:func:`parse_header` reads only the header of a ``.safetensors`` file and returns a
:class:`SafetensorsHeader` whose every entry is safe to slice: the bytes of each tensor lie inside
the file, no two tensors share a byte, no byte of the data region is left unindexed or trails
the last tensor, and each tensor's byte count equals prod(shape) x dtype size. Anything else is
a :class:`~models.errors.ModelError` naming the file and the tensor. The rules are those of the
reference implementation (huggingface/safetensors), so a file that this parser accepts is also
accepted by ``safetensors`` and decodes to the same tensors (tests/unit/test_fuzz_safetensors.py
checks both directions by fuzzing).

The runtime has its own copy of these rules in app/engine/safetensors_header.py (the console
never imports ``models`` and ``models`` never imports ``app``); the fuzz test runs both parsers
on the same bytes and requires them to agree.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from .errors import ModelError, require_file

__all__ = ["DTYPE_SIZES", "MAX_HEADER_BYTES", "TensorEntry", "SafetensorsHeader", "parse_header"]

# dtype name -> bytes per element (the safetensors spec's names).
DTYPE_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
               "U8": 1, "BOOL": 1}
# The reference implementation refuses headers above 100 MB; so do we.
MAX_HEADER_BYTES = 100_000_000
_U64 = 2**64  # dims, offsets and byte counts are u64 there: anything at or above overflows


@dataclass(frozen=True)
class TensorEntry:
    """One validated header entry; ``begin``/``end`` are absolute byte offsets in the file."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class SafetensorsHeader:
    """A validated header: ``tensors`` in file (header) order, ``metadata`` the string map."""

    path: Path
    file_size: int
    data_start: int  # 8 + header length
    tensors: dict[str, TensorEntry]
    metadata: dict[str, str]


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    seen: dict[str, object] = {}
    for k, v in pairs:
        if k in seen:
            raise ValueError(f"key {k!r} appears twice")
        seen[k] = v
    return seen


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_header(path: str | Path, dtypes: Mapping[str, int] = DTYPE_SIZES) -> SafetensorsHeader:
    """Read and validate the header of ``path``; ``dtypes`` (name -> element size) are the ones
    the caller can decode. Raises ModelError naming the file (and tensor) for any fault."""
    p = require_file(path, "safetensors weights")
    size = p.stat().st_size
    if size < 8:
        raise ModelError(f"{p}: truncated safetensors: {size} bytes, not even the 8-byte header length")
    with open(p, "rb") as fh:
        hlen = int.from_bytes(fh.read(8), "little")
        if hlen > MAX_HEADER_BYTES:
            raise ModelError(f"{p}: corrupted safetensors: header length {hlen} is above the "
                             f"{MAX_HEADER_BYTES}-byte limit")
        if 8 + hlen > size:
            raise ModelError(f"{p}: truncated or corrupted safetensors: header says {hlen} header bytes "
                             f"but the file has {size} bytes in all")
        raw = fh.read(hlen)
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise ModelError(f"{p}: corrupted safetensors header: {e}") from None
    meta = header.pop("__metadata__", None)
    if meta is None:
        meta = {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ModelError(f"{p}: corrupted safetensors header: __metadata__ is not a map of strings")
    base = 8 + hlen
    entries: dict[str, TensorEntry] = {}
    for name, info in header.items():
        where = f"{p}: tensor {name!r}"
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
            raise ModelError(f"{where}: header entry lacks dtype, shape or data_offsets")
        dt, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(dt, str) or dt not in dtypes:
            raise ModelError(f"{where}: unsupported dtype {dt!r}; supported: {', '.join(dtypes)}")
        if not isinstance(shape, list) or not all(_is_int(d) and 0 <= d < _U64 for d in shape):
            raise ModelError(f"{where}: shape {shape!r} is not a list of non-negative integers")
        if not (isinstance(offs, list) and len(offs) == 2 and all(_is_int(o) for o in offs)):
            raise ModelError(f"{where}: data_offsets {offs!r} is not a pair of integers")
        a, b = offs
        if not 0 <= a <= b < _U64:
            raise ModelError(f"{where}: data_offsets [{a}, {b}] are not 0 <= begin <= end")
        need = 1
        for d in [*shape, dtypes[dt]]:  # in order, as the reference does: an overflow is an error
            need *= d
            if need >= _U64:
                raise ModelError(f"{where}: shape {shape} {dt} overflows a 64-bit byte count")
        if b - a != need:
            raise ModelError(f"{where}: {dt}{shape} needs {need} bytes, data_offsets give {b - a}")
        entries[name] = TensorEntry(name, dt, tuple(shape), base + a, base + b)
    last = max(entries.values(), key=lambda e: e.end, default=None)
    if last is not None and last.end > size:
        raise ModelError(f"{p}: truncated safetensors: expected {last.end} bytes, found {size} "
                         f"(tensor {last.name!r} ends past the end of the file)")
    _check_layout(p, entries, base, size)
    return SafetensorsHeader(p, size, base, entries, dict(meta))


def _check_layout(p: Path, entries: dict[str, TensorEntry], base: int, size: int) -> None:
    """The data region [base, size) is tiled exactly: no overlap, no hole, nothing trailing."""
    at, prev = base, None
    for e in sorted(entries.values(), key=lambda e: (e.begin, e.end)):
        if e.begin < at:
            raise ModelError(f"{p}: tensor {e.name!r} bytes [{e.begin - base}, {e.end - base}) overlap "
                             f"tensor {prev.name!r} [{prev.begin - base}, {prev.end - base})")
        if e.begin > at:
            after = f"after tensor {prev.name!r}" if prev else "at the start of the data"
            raise ModelError(f"{p}: tensor {e.name!r}: bytes [{at - base}, {e.begin - base}) {after} "
                             f"belong to no tensor")
        at, prev = e.end, e
    if at != size:
        raise ModelError(f"{p}: corrupted safetensors: {size - at} bytes after the last tensor "
                         f"belong to no tensor")
