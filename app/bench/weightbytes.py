"""Weight bytes one decode token reads, per engine, from the files themselves.

A decode step reads every weight tensor once, except the token-embedding table, of which it
reads one row; when the output head is tied to the embedding (no separate head tensor), the
table is also read whole as the head. Both counters apply that same rule:
  * `kvdeck_weight_bytes(folder)`: from the safetensors header of a kvdeck model folder
    (data_offsets give each tensor's stored bytes; nothing is loaded);
  * `gguf_weight_bytes(path)`: from a GGUF file's tensor infos via the `gguf` package.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class WeightBytes:
    """Bytes read per decode token, split by role. `head_kind` names the head's storage."""
    head: int           # output projection (the whole embedding table when tied)
    layers: int         # every tensor of the transformer blocks + the final norm
    embed_row: int      # one row of the token-embedding table
    head_kind: str      # e.g. "nvfp4", "Q8_0, tied embedding"
    layers_kind: str    # the storage of the largest share of `layers`, e.g. "nvfp4", "Q4_0"

    @property
    def total(self) -> int:
        return self.head + self.layers + self.embed_row

    def as_dict(self) -> dict:
        return {"total": self.total, "head": self.head, "layers": self.layers,
                "embed_row": self.embed_row, "head_kind": self.head_kind,
                "layers_kind": self.layers_kind}


# ============================================================================
# kvdeck model folder (safetensors)
# ============================================================================
KV_EMBED = "model.embed_tokens.weight"
KV_HEAD_PREFIX = "lm_head."


def _safetensors_header(f: Path) -> dict:
    with open(f, "rb") as fh:
        head = fh.read(8)
        if len(head) != 8:
            raise ValueError(f"{f}: shorter than a safetensors header")
        (n,) = struct.unpack("<Q", head)
        raw = fh.read(n)
    if len(raw) != n:
        raise ValueError(f"{f}: header of {n} bytes is truncated")
    hdr = json.loads(raw)
    hdr.pop("__metadata__", None)
    return hdr


def kvdeck_weight_bytes(folder: Path) -> WeightBytes:
    """Per-token weight bytes of a kvdeck format folder (config.json + model.safetensors)."""
    f = Path(folder) / "model.safetensors"
    hdr = _safetensors_header(f)
    size = {k: v["data_offsets"][1] - v["data_offsets"][0] for k, v in hdr.items()}
    embed_keys = [k for k in size if k == KV_EMBED or k.startswith(KV_EMBED + ".")]  # rows, or int8 codes + scales
    if not embed_keys:
        raise ValueError(f"{f}: no tensor {KV_EMBED} (or {KV_EMBED}.codes)")
    rows = hdr[embed_keys[0]]["shape"][0]
    embed = sum(size[k] for k in embed_keys)
    head_keys = [k for k in size if k.startswith(KV_HEAD_PREFIX)]
    weights = json.loads((Path(folder) / "config.json").read_text()).get("weights", {})
    fmt = weights.get("format", "?")
    if head_keys:   # the head's own format when the recipe names one (e.g. an 8-bit head)
        head, kind = sum(size[k] for k in head_keys), weights.get("recipe", {}).get("head", fmt)
    else:
        codes = hdr.get(KV_EMBED + ".codes")
        kind = "w8a8, tied embedding" if codes and codes["dtype"] == "I8" else f"{hdr[KV_EMBED]['dtype']}, tied embedding"
        head = embed
    layers = sum(v for k, v in size.items() if k not in embed_keys and k not in head_keys)
    return WeightBytes(head=head, layers=layers, embed_row=embed // rows, head_kind=kind, layers_kind=fmt)


# ============================================================================
# GGUF (llama.cpp)
# ============================================================================
GGUF_EMBED = "token_embd.weight"
GGUF_HEAD = "output.weight"


def gguf_weight_bytes(path: Path) -> WeightBytes:
    """Per-token weight bytes of a GGUF model (tensor types and sizes from its header)."""
    from gguf import GGUFReader

    tensors = {t.name: t for t in GGUFReader(str(path)).tensors}
    if GGUF_EMBED not in tensors:
        raise ValueError(f"{path}: no tensor {GGUF_EMBED}")
    emb = tensors[GGUF_EMBED]
    rows = int(emb.n_elements // int(emb.shape[0]))   # shape[0] = ne0, the row length
    embed = int(emb.n_bytes)
    if GGUF_HEAD in tensors:
        out = tensors[GGUF_HEAD]
        head, kind = int(out.n_bytes), out.tensor_type.name
    else:
        head, kind = embed, f"{emb.tensor_type.name}, tied embedding"
    by_type: dict[str, int] = {}
    for n, t in tensors.items():
        if n not in (GGUF_EMBED, GGUF_HEAD):
            by_type[t.tensor_type.name] = by_type.get(t.tensor_type.name, 0) + int(t.n_bytes)
    return WeightBytes(head=head, layers=sum(by_type.values()), embed_row=embed // rows, head_kind=kind,
                       layers_kind=max(by_type, key=by_type.get))

