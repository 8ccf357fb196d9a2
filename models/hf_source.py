"""Hugging Face folder → :class:`models.writer.ModelSource`.

A folder holds ``config.json``, ``model.safetensors`` or shards listed in
``model.safetensors.index.json``, ``tokenizer.json`` and a chat template (``tokenizer_config.json``
"chat_template", or ``chat_template.jinja`` / ``chat_template.json`` as transformers 5 saves it).
Supported: LlamaForCausalLM ("llama"), Qwen2ForCausalLM ("qwen2", q/k/v biases),
Qwen3ForCausalLM ("qwen3", q/k RMSNorm). HF checkpoints are already in rotate-half layout, so
tensors pass through unchanged (only cast to float32).

Safetensors files are parsed here (header + ``np.memmap``) rather than with safetensors.numpy,
which cannot read bf16: bf16 is widened to f32 by a 16-bit shift. The header is validated by
models/safetensors_check.py; config.json fields and every tensor's shape are checked against
each other before any tensor is read, so a damaged or lying checkpoint is a ModelError naming the
file and the field or tensor, never a wrong tensor in the output.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from .errors import ModelError, require_file
from .hf_config import ARCHITECTURES, expected_shapes, read_hf_config, token_ids
from .safetensors_check import parse_header
from .tokenizer_build import detect_chat_format, stop_token_ids
from .writer import ModelSource

__all__ = ["ARCHITECTURES", "SafetensorsFile", "load_hf_folder", "bf16_to_f32"]

_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16,
           "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
           "BOOL": np.bool_}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def bf16_to_f32(u16: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (uint16, any shape) -> float32 of the same shape (exact)."""
    return (u16.astype(np.uint32) << 16).view(np.float32)


class SafetensorsFile:
    """One safetensors file: header validated by :func:`models.safetensors_check.parse_header`
    (offsets inside the file, no overlap or hole, bytes = prod(shape) x dtype size), tensors read
    lazily through a read-only memmap.

    ``names``: tensor names in file order; ``shape(name)``; ``read(name)`` -> float32 ndarray
    (floating tensors; bf16/f16/f64 converted) or the stored integer dtype.
    """

    def __init__(self, path: str | Path):
        self.header = parse_header(path, {k: np.dtype(v).itemsize for k, v in _DTYPES.items()})
        self.path = self.header.path
        self.metadata = self.header.metadata
        self._entries = self.header.tensors
        self._mm = np.memmap(self.path, dtype=np.uint8, mode="r")

    @property
    def names(self) -> list[str]:
        return list(self._entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._entries[name].shape

    def numel(self, name: str) -> int:
        return self._entries[name].numel

    def read(self, name: str) -> np.ndarray:
        """The tensor as an ndarray in its logical shape; floating types as float32 (copy)."""
        e = self._entries[name]
        arr = self._mm[e.begin: e.end].view(_DTYPES[e.dtype]).reshape(e.shape)
        if e.dtype == "BF16":
            return bf16_to_f32(arr)
        if e.dtype == "F64":
            with np.errstate(over="ignore"):
                out = arr.astype(np.float32)
            if np.isinf(out).any() and not np.isinf(arr[np.isinf(out)]).all():
                raise ModelError(f"{self.path}: tensor {name!r} (F64) has values beyond the float32 range")
            return out
        if e.dtype in ("F16", "F32"):
            return arr.astype(np.float32)
        return np.array(arr)


def _read_json(path: Path, what: str) -> dict:
    require_file(path, what)
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise ModelError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ModelError(f"{path}: the {what} is not a JSON object")
    return obj


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        wm = _read_json(index, "safetensors index").get("weight_map")
        if not isinstance(wm, dict) or not wm or not all(isinstance(f, str) for f in wm.values()):
            raise ModelError(f"{index}: no 'weight_map' of tensor name -> file name in the safetensors index")
        files = sorted({folder / f for f in wm.values()})
        for f in files:
            require_file(f, f"weight shard listed in {index.name}")
        return files
    single = folder / "model.safetensors"
    if single.is_file():
        return [single]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelError(f"{single}: missing model weights (no *.safetensors in {folder})")
    return files


def _chat_template(folder: Path, tok_cfg: dict) -> str | None:
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    ct = tok_cfg.get("chat_template")
    if ct is None and (folder / "chat_template.json").is_file():
        ct = _read_json(folder / "chat_template.json", "chat template").get("chat_template")
    if isinstance(ct, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        by_name = {d.get("name"): d.get("template") for d in ct if isinstance(d, dict)}
        ct = by_name.get("default") or next(iter(by_name.values()), None)
    if ct is not None and not isinstance(ct, str):
        raise ModelError(f"{folder}: chat_template should be a string, got {type(ct).__name__}")
    return ct


def _sha256_files(files: list[Path], chunk: int = 1 << 22) -> str:
    """sha256 over the concatenated bytes of ``files`` in the given (sorted) order."""
    h = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            while b := fh.read(chunk):
                h.update(b)
    return h.hexdigest()


_FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")


def _check_tensors(shapes: dict[str, tuple[int, ...]], where: dict[str, SafetensorsFile],
                   files: list[SafetensorsFile], cfg_path: Path) -> None:
    """Every expected tensor present, floating, of the shape config.json implies; none extra."""
    missing = [n for n in shapes if n not in where]
    if missing:
        shown = ", ".join(missing[:5]) + (f" (+{len(missing) - 5} more)" if len(missing) > 5 else "")
        raise ModelError(f"{files[0].path}: missing tensors {shown}")
    extra = [n for n in where if n not in shapes]
    if extra:
        shown = ", ".join(extra[:5]) + (f" (+{len(extra) - 5} more)" if len(extra) > 5 else "")
        raise ModelError(f"{where[extra[0]].path}: tensors {shown} are not part of the model "
                         f"{cfg_path.name} describes")
    for n, want in shapes.items():
        e = where[n].header.tensors[n]
        if e.dtype not in _FLOAT_DTYPES:
            raise ModelError(f"{where[n].path}: tensor {n!r} has dtype {e.dtype}, expected a float type")
        if e.shape != want:
            raise ModelError(f"{where[n].path}: tensor {n!r} has shape {list(e.shape)}, "
                             f"{cfg_path.name} implies {list(want)}")


def load_hf_folder(path: str | Path, name: str | None = None) -> ModelSource:
    """Read a Hugging Face model folder into a ModelSource (name defaults to the folder name,
    lower-cased). Raises ModelError naming the file for anything missing, damaged or unsupported."""
    folder = Path(path)
    if not folder.is_dir():
        raise ModelError(f"{folder}: not a model folder (no such directory)")
    cfg_path = folder / "config.json"
    hf = _read_json(cfg_path, "model config")
    c = read_hf_config(hf, cfg_path)
    arch, arch_name = c.arch, c.arch_name

    # --- weights: every tensor the config implies, with the shape it implies, and nothing else ---
    files = [SafetensorsFile(f) for f in _weight_files(folder)]
    where: dict[str, SafetensorsFile] = {}
    for sf in files:
        for n in sf.names:
            if n.endswith(_IGNORED_SUFFIXES):
                continue
            if n in where:
                raise ModelError(f"{sf.path}: tensor {n!r} is also in {where[n].path.name}")
            where[n] = sf
    if any(n.endswith("o_proj.bias") for n in where):
        raise ModelError(f"{files[0].path}: o_proj biases are not supported (only q/k/v biases, as in Qwen2)")
    tied = c.tie_word_embeddings
    bias = arch == "qwen2" or "model.layers.0.self_attn.q_proj.bias" in where
    qk_norm = arch == "qwen3" or "model.layers.0.self_attn.q_norm.weight" in where
    if tied:
        where.pop("lm_head.weight", None)
    emb = where.get("model.embed_tokens.weight")
    rows = (emb.shape("model.embed_tokens.weight") or (0,))[0] if emb is not None else 0
    vocab = c.vocab_size if c.vocab_size is not None else rows
    shapes = expected_shapes(c, vocab, bias, qk_norm)
    _check_tensors(shapes, where, files, cfg_path)
    expected = list(shapes)

    # --- tokenizer + chat ---
    tok_path = require_file(folder / "tokenizer.json", "tokenizer")
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(tok_path))
    except Exception as e:  # noqa: BLE001 - tokenizers raises its own Exception type
        raise ModelError(f"{tok_path}: not a valid tokenizers file: {e}") from None
    tok_cfg_path = folder / "tokenizer_config.json"
    tok_cfg = _read_json(tok_cfg_path, "tokenizer config") if tok_cfg_path.is_file() else {}
    template = _chat_template(folder, tok_cfg)
    chat_format = detect_chat_format(template)
    gen_path = folder / "generation_config.json"
    gen = _read_json(gen_path, "generation config") if gen_path.is_file() else {}

    def tok_id(key: str) -> int | None:
        t = tok_cfg.get(key)
        if isinstance(t, dict):
            t = t.get("content")
        return tok.token_to_id(t) if isinstance(t, str) else None

    eos_ids = c.eos_token_ids + token_ids(gen.get("eos_token_id"), "eos_token_id", gen_path)
    eos = tok_id("eos_token")
    if eos is None:
        eos = eos_ids[0] if eos_ids else None
    bos = c.bos_token_ids[0] if c.bos_token_ids else tok_id("bos_token")
    stops = stop_token_ids(chat_format, [eos, *eos_ids], tok.token_to_id)
    bad = [i for i in (bos, *stops) if i is not None and not 0 <= i < vocab]
    if bad:
        raise ModelError(f"{cfg_path}: token ids {bad} (bos/eos/stop) are outside the vocabulary [0, {vocab})")
    meta = {
        "architecture": arch,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "vocab_size": int(vocab),
        "rope_theta": c.rope_theta,
        "rms_norm_eps": c.rms_norm_eps,
        "max_position_embeddings": c.max_position_embeddings,
        "tie_word_embeddings": tied,
        "attention_bias": bias,
        "qk_norm": qk_norm,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "stop_token_ids": stops,
        "chat_format": chat_format,
        "chat_template": template,
        "rope_scaling": c.rope_scaling,
    }

    names = [n for n in expected if n in where]

    def tensors() -> Iterator[tuple[str, np.ndarray]]:
        for n in names:
            yield n, where[n].read(n)

    paths = [sf.path for sf in files]
    source: dict[str, Any] = {"kind": "hf", "path": str(folder.resolve()), "architecture": arch_name,
                              "files": [p.name for p in paths], "sha256": _sha256_files(paths)}
    return ModelSource(
        name=name or folder.name.lower(),
        meta=meta,
        tensors=tensors,
        tokenizer_json=tok_path.read_text(encoding="utf-8"),
        source=source,
        f32_bytes=4 * sum(where[n].numel(n) for n in names),
    )
