"""Hugging Face folder → :class:`models.writer.ModelSource`.

A folder holds ``config.json``, ``model.safetensors`` or shards listed in
``model.safetensors.index.json``, ``tokenizer.json`` and a chat template (``tokenizer_config.json``
"chat_template", or ``chat_template.jinja`` / ``chat_template.json`` as transformers 5 saves it).
Supported: LlamaForCausalLM ("llama"), Qwen2ForCausalLM ("qwen2", q/k/v biases),
Qwen3ForCausalLM ("qwen3", q/k RMSNorm). HF checkpoints are already in rotate-half layout, so
tensors pass through unchanged (only cast to float32).

Safetensors files are parsed here (header + ``np.memmap``) rather than with safetensors.numpy,
which cannot read bf16: bf16 is widened to f32 by a 16-bit shift. A header whose offsets run past
the end of the file is reported as truncated with expected vs actual size.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from .errors import ModelError, require_file
from .tokenizer_build import detect_chat_format, stop_token_ids
from .writer import ModelSource

__all__ = ["ARCHITECTURES", "SafetensorsFile", "load_hf_folder", "bf16_to_f32"]

ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}

_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16,
           "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
           "BOOL": np.bool_}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def bf16_to_f32(u16: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (uint16, any shape) -> float32 of the same shape (exact)."""
    return (u16.astype(np.uint32) << 16).view(np.float32)


class SafetensorsFile:
    """One safetensors file: validated header, tensors read lazily through a memmap.

    ``names``: tensor names in file order; ``shape(name)``; ``read(name)`` -> float32 ndarray
    (floating tensors; bf16/f16/f64 converted) or the stored integer dtype.
    """

    def __init__(self, path: str | Path):
        self.path = p = require_file(path, "safetensors weights")
        size = p.stat().st_size
        if size < 8:
            raise ModelError(f"{p}: truncated safetensors: {size} bytes, not even the 8-byte header length")
        with open(p, "rb") as fh:
            (hlen,) = struct.unpack("<Q", fh.read(8))
            if 8 + hlen > size:
                raise ModelError(f"{p}: truncated or corrupted safetensors: header says {hlen} header bytes "
                                 f"but the file has {size} bytes in all")
            raw = fh.read(hlen)
        try:
            header = json.loads(raw)
            if not isinstance(header, dict):
                raise ValueError("header is not a JSON object")
        except (ValueError, UnicodeDecodeError) as e:
            raise ModelError(f"{p}: corrupted safetensors header: {e}") from None
        self.metadata = header.pop("__metadata__", None) or {}
        self._hdr: dict[str, dict] = header
        self._base = 8 + hlen
        end = 0
        for name, info in header.items():
            try:
                dt, shape, (a, b) = info["dtype"], info["shape"], info["data_offsets"]
            except (KeyError, TypeError, ValueError):
                raise ModelError(f"{p}: corrupted safetensors header entry for tensor {name!r}") from None
            if dt not in _DTYPES:
                raise ModelError(f"{p}: tensor {name!r} has unsupported dtype {dt}; "
                                 f"supported: {', '.join(_DTYPES)}")
            need = int(np.prod(shape, dtype=np.int64)) * np.dtype(_DTYPES[dt]).itemsize
            if b - a != need:
                raise ModelError(f"{p}: corrupted safetensors: tensor {name!r} {dt}{shape} needs {need} bytes, "
                                 f"header gives {b - a}")
            end = max(end, b)
        if self._base + end > size:
            raise ModelError(f"{p}: truncated safetensors: expected {self._base + end} bytes, found {size}")
        self._mm = np.memmap(p, dtype=np.uint8, mode="r") if size else None

    @property
    def names(self) -> list[str]:
        return list(self._hdr)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._hdr[name]["shape"])

    def numel(self, name: str) -> int:
        return int(np.prod(self.shape(name), dtype=np.int64))

    def read(self, name: str) -> np.ndarray:
        """The tensor as an ndarray in its logical shape; floating types as float32 (copy)."""
        info = self._hdr[name]
        a, b = info["data_offsets"]
        raw = self._mm[self._base + a: self._base + b]
        arr = raw.view(_DTYPES[info["dtype"]]).reshape(info["shape"])
        if info["dtype"] == "BF16":
            return bf16_to_f32(arr)
        if info["dtype"] in ("F16", "F64", "F32"):
            return arr.astype(np.float32)
        return np.array(arr)


def _read_json(path: Path, what: str) -> dict:
    require_file(path, what)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ModelError(f"{path}: not valid JSON: {e}") from None


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        wm = _read_json(index, "safetensors index").get("weight_map")
        if not isinstance(wm, dict) or not wm:
            raise ModelError(f"{index}: no 'weight_map' in the safetensors index")
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
    return ct


def _as_list(v: Any) -> list[int]:
    if v is None:
        return []
    return [int(x) for x in (v if isinstance(v, list) else [v])]


def _sha256_files(files: list[Path], chunk: int = 1 << 22) -> str:
    """sha256 over the concatenated bytes of ``files`` in the given (sorted) order."""
    h = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            while b := fh.read(chunk):
                h.update(b)
    return h.hexdigest()


def expected_tensor_names(arch: str, n_layers: int, tied: bool, bias: bool, qk_norm: bool) -> list[str]:
    """The HF tensor names a supported checkpoint must contain."""
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    if not tied:
        names.append("lm_head.weight")
    for i in range(n_layers):
        L = f"model.layers.{i}."
        names += [L + "input_layernorm.weight", L + "post_attention_layernorm.weight"]
        names += [L + f"self_attn.{x}_proj.weight" for x in "qkvo"]
        names += [L + f"mlp.{x}_proj.weight" for x in ("gate", "up", "down")]
        if bias:
            names += [L + f"self_attn.{x}_proj.bias" for x in "qkv"]
        if qk_norm:
            names += [L + "self_attn.q_norm.weight", L + "self_attn.k_norm.weight"]
    return names


def load_hf_folder(path: str | Path, name: str | None = None) -> ModelSource:
    """Read a Hugging Face model folder into a ModelSource (name defaults to the folder name,
    lower-cased). Raises ModelError naming the file for anything missing, damaged or unsupported."""
    folder = Path(path)
    if not folder.is_dir():
        raise ModelError(f"{folder}: not a model folder (no such directory)")
    cfg_path = folder / "config.json"
    hf = _read_json(cfg_path, "model config")
    archs = hf.get("architectures") or []
    arch_name = next((a for a in archs if a in ARCHITECTURES), None)
    if arch_name is None:
        raise ModelError(f"{cfg_path}: unsupported architecture {', '.join(archs) or hf.get('model_type')!s}; "
                         f"supported: {', '.join(ARCHITECTURES)}")
    arch = ARCHITECTURES[arch_name]
    if hf.get("mlp_bias"):
        raise ModelError(f"{cfg_path}: mlp_bias=true is not supported by kvdeck's {arch} forward pass")
    if arch == "qwen2" and hf.get("use_sliding_window"):
        raise ModelError(f"{cfg_path}: use_sliding_window=true is not supported")

    # --- weights ---
    files = [SafetensorsFile(f) for f in _weight_files(folder)]
    where: dict[str, SafetensorsFile] = {}
    for sf in files:
        for n in sf.names:
            if not n.endswith(_IGNORED_SUFFIXES):
                where[n] = sf
    if any(n.endswith("o_proj.bias") for n in where):
        raise ModelError(f"{files[0].path}: o_proj biases are not supported (only q/k/v biases, as in Qwen2)")
    n_layers = int(hf["num_hidden_layers"])
    tied = bool(hf.get("tie_word_embeddings", False))
    bias = "model.layers.0.self_attn.q_proj.bias" in where
    qk_norm = "model.layers.0.self_attn.q_norm.weight" in where
    expected = expected_tensor_names(arch, n_layers, tied, bias, qk_norm)
    missing = [n for n in expected if n not in where]
    if missing:
        shown = ", ".join(missing[:5]) + (f" (+{len(missing) - 5} more)" if len(missing) > 5 else "")
        raise ModelError(f"{files[0].path}: missing tensors {shown}")
    if tied:
        where.pop("lm_head.weight", None)

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

    eos_ids = _as_list(hf.get("eos_token_id")) + _as_list(gen.get("eos_token_id"))
    eos = tok_id("eos_token")
    if eos is None:
        eos = eos_ids[0] if eos_ids else None
    bos = hf.get("bos_token_id")
    bos = _as_list(bos)[0] if bos is not None else tok_id("bos_token")

    rope = hf.get("rope_parameters") or {}
    rope_theta = hf.get("rope_theta", rope.get("rope_theta", 10000.0))
    scaling = hf.get("rope_scaling") or ({k: v for k, v in rope.items() if k != "rope_theta"}
                                         if rope.get("rope_type", "default") != "default" else None)
    if scaling and scaling.get("rope_type", scaling.get("type")) in ("default", None):
        scaling = None
    n_head = int(hf["num_attention_heads"])
    hidden = int(hf["hidden_size"])
    emb_rows = where["model.embed_tokens.weight"].shape("model.embed_tokens.weight")[0]
    meta = {
        "architecture": arch,
        "hidden_size": hidden,
        "intermediate_size": int(hf["intermediate_size"]),
        "num_hidden_layers": n_layers,
        "num_attention_heads": n_head,
        "num_key_value_heads": int(hf.get("num_key_value_heads") or n_head),
        "head_dim": int(hf.get("head_dim") or hidden // n_head),
        "vocab_size": int(emb_rows),
        "rope_theta": float(rope_theta),
        "rms_norm_eps": float(hf.get("rms_norm_eps", 1e-6)),
        "max_position_embeddings": int(hf.get("max_position_embeddings", 2048)),
        "tie_word_embeddings": tied,
        "attention_bias": bias,
        "qk_norm": qk_norm,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "stop_token_ids": stop_token_ids(chat_format, [eos, *eos_ids], tok.token_to_id),
        "chat_format": chat_format,
        "chat_template": template,
        "rope_scaling": scaling,
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
