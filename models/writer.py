"""The kvdeck model folder (format_version 1, docs/ENGINE.md): write it, read it back, check it.

Input of the writer is a :class:`ModelSource` (what a GGUF or HF reader produces): config fields,
a lazy stream of float32 tensors under Hugging Face names in HF layout, and a tokenizer.
:func:`write_format` writes ``<out_root>/<model>/<format>/`` = config.json + model.safetensors +
tokenizer.json into a temporary sibling folder and renames it into place, so a crash never
leaves a half folder under the final name. :func:`folder_is_current` is the idempotency check.

Per-tensor rules (ENGINE.md):
  * ``model.embed_tokens.weight`` [V, H]: f16, f32 in the f32 folder.
  * norms (``*layernorm.weight``, ``model.norm.weight``, ``*.q_norm.weight``, ``*.k_norm.weight``)
    and biases: f32.
  * linear weights ``*_proj.weight`` and ``lm_head.weight`` [N, K]: f16/f32 as ``X.weight``;
    nvfp4/w4a8 via ``models.quant.quantize_linear`` as ``X.weight.codes`` etc.
  * tied embeddings: no ``lm_head`` in f16/f32 folders; in nvfp4/w4a8 folders ``lm_head.weight.*``
    is quantised from the embedding.
  * ``gguf`` (GGUF sources only): the file's own blocks, not re-rounded (models/quant/gguf_blocks):
    Q4_0 -> w4a8 group 32, Q4_1 -> w4a8 group 32 + ``X.weight.mins``, Q8_0 -> w8a8 (int8 codes);
    a tied head takes the embedding's blocks (Q8_0 in the default model: an 8-bit head); any
    other tensor type is stored f16. The embedding rows are f16 (dequantised) for the lookup.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from .errors import ModelError
from .manifest import FORMATS

__all__ = ["FORMAT_VERSION", "CONVERTER_VERSION", "ModelSource", "write_format", "write_model",
           "read_folder_config", "folder_is_current", "CONFIG_KEYS"]

FORMAT_VERSION = 1
# Bump when the converter's output changes for the same source: forces `fetch` to rebuild.
# 2: nvfp4/w4a8 scales by the "mse" recipe (models/quant; was "amax"), recorded in config.json.
# 3: GPTQ in float64 (models/quant/gptq.py): the same codes on every machine (in float32 they
#    depended on the CPU's SIMD paths: w4a8 perplexity 1.190x-1.238x f32 from one source).
CONVERTER_VERSION = 3
# Scale recipe of nvfp4/w4a8 linears (models.quant RECIPES); weights.recipe.scales records it.
SCALE_RECIPE = "mse"

# config.json keys (besides format_version/model/weights/source) a ModelSource must provide.
CONFIG_KEYS = ("architecture", "hidden_size", "intermediate_size", "num_hidden_layers",
               "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
               "rope_theta", "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings",
               "attention_bias", "qk_norm", "bos_token_id", "eos_token_id", "stop_token_ids",
               "chat_format", "chat_template")
# Optional keys, written only when the source has them (e.g. Llama 3.x RoPE scaling).
OPTIONAL_CONFIG_KEYS = ("rope_scaling",)


@dataclass
class ModelSource:
    """A model ready to be written.

    meta: every key of CONFIG_KEYS (+ optional ones), values JSON-serialisable.
    tensors: callable returning a fresh iterator of (HF name, float32 array in HF layout); it
      yields ``lm_head.weight`` only when the embeddings are untied. Called once per format, so
      peak memory is one format's output plus one source tensor.
    tokenizer_json: the serialised ``tokenizers`` file.
    source: the config's "source" record (kind, file, sha256, ...).
    """

    name: str
    meta: dict[str, Any]
    tensors: Callable[[], Iterator[tuple[str, np.ndarray]]]
    tokenizer_json: str
    source: dict[str, Any] = field(default_factory=dict)
    f32_bytes: int | None = None  # size of all tensors as f32, if known (enables caching)
    # GGUF sources: a fresh iterator of (HF name, kind, data) with the file's raw blocks
    # (kind Q4_0 | Q4_1 | Q8_0, data u8 [N, bytes per row]) or kind "F32" and an f32 tensor.
    blocks: Callable[[], Iterator[tuple[str, str, np.ndarray]]] | None = None


def _is_norm(name: str) -> bool:
    return name.endswith(("layernorm.weight", "q_norm.weight", "k_norm.weight")) or name == "model.norm.weight"


def _is_linear(name: str) -> bool:
    return name.endswith("_proj.weight") or name == "lm_head.weight"


def _quantize(name: str, w: np.ndarray, fmt: str, recipe: dict[str, int]) -> dict[str, np.ndarray]:
    """Linear weight w: f32 [N, K] -> {name-prefixed tensors} in format fmt."""
    if fmt == "f32":
        return {name: np.ascontiguousarray(w, dtype=np.float32)}
    if fmt == "f16":
        return {name: np.ascontiguousarray(w.astype(np.float16))}
    from .quant import quantize_linear  # numpy codecs; imported lazily (only nvfp4/w4a8 need it)

    prefix = name[: -len("weight")]  # "model.layers.0.self_attn.q_proj."
    out = quantize_linear(np.ascontiguousarray(w, dtype=np.float32), fmt, group=recipe["w4a8_group"],
                          recipe=SCALE_RECIPE)
    return {prefix + k: np.ascontiguousarray(v) for k, v in out.items()}


def _exact(name: str, kind: str, data: np.ndarray, K: int) -> dict[str, np.ndarray]:
    """One GGUF tensor's blocks in the gguf format's layout (see module docstring)."""
    from .quant.gguf_blocks import q4_to_w4a8, q8_0_to_w8a8

    prefix = name[: -len("weight")]
    N = data.shape[0]
    if kind in ("Q4_0", "Q4_1"):
        out = q4_to_w4a8(data, N, K, kind)
    elif kind == "Q8_0":
        out = q8_0_to_w8a8(data, N, K)
    else:
        return {name: np.ascontiguousarray(np.asarray(data, np.float32).astype(np.float16))}
    return {prefix + "weight." + k: np.ascontiguousarray(v) for k, v in out.items()}


def convert_exact(src: ModelSource, recipe: dict | None = None) -> dict[str, np.ndarray]:
    """The gguf format: the source file's own blocks (module docstring)."""
    if src.blocks is None:
        raise ModelError(f"{src.name}: weight format 'gguf' keeps a GGUF file's own blocks; this source "
                         f"({src.source.get('kind', '?')}) is not a GGUF file")
    from .quant.gguf_blocks import dequantize_w4a8, dequantize_w8a8

    tied = bool(src.meta["tie_word_embeddings"])
    H = int(src.meta["hidden_size"])
    recipe = recipe or {}
    out: dict[str, np.ndarray] = {}
    for name, kind, data in src.blocks():
        if name == "model.embed_tokens.weight" and kind == "Q8_0" and _embed_format("gguf", recipe) == "w8a8":
            q = _exact(name, kind, data, H)  # the file's int8 rows: the lookup and (tied) the head
            out.update(q)
        elif name == "model.embed_tokens.weight":  # [V, H]: f16 rows for the lookup
            q = _exact(name, kind, data, H)
            if kind == "F32":
                rows = data
            elif kind == "Q8_0":
                rows = dequantize_w8a8(q["model.embed_tokens.weight.codes"], q["model.embed_tokens.weight.scales"])
            else:
                rows = dequantize_w4a8(q["model.embed_tokens.weight.codes"], q["model.embed_tokens.weight.scales"],
                                       q.get("model.embed_tokens.weight.mins"))
            out[name] = np.ascontiguousarray(rows[:, :H].astype(np.float16))
            if tied:
                out.update({"lm_head" + k[len("model.embed_tokens"):]: v for k, v in q.items()})
        elif _is_norm(name) or name.endswith(".bias"):
            out[name] = np.ascontiguousarray(data, dtype=np.float32)
        elif _is_linear(name):
            if tied and name == "lm_head.weight":
                continue
            K = data.shape[1] if kind == "F32" else data.shape[1] // {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}[kind] * 32
            out.update(_exact(name, kind, data, K))
        else:
            raise ModelError(f"{src.source.get('file', src.name)}: unexpected tensor {name!r}")
    return out


def _head_format(fmt: str, recipe: dict) -> str:
    """The lm_head's format in a 4-bit folder: the folder's own, or w8a8 when the recipe says
    `head = "w8a8"` (an 8-bit head: int8 codes, f16 scale per 32; models/quant/w8a8.py)."""
    head = recipe.get("head", "4bit")
    if head not in ("4bit", "w8a8"):
        raise ModelError(f"[quant] head = {head!r}: expected \"4bit\" or \"w8a8\"")
    return "w8a8" if head == "w8a8" and fmt in ("nvfp4", "w4a8") else fmt


def _embed_format(fmt: str, recipe: dict) -> str:
    """The embedding rows: "w8a8" (int8, f16 scale per 32) when the recipe says `embed = "w8a8"`
    in a nvfp4 / w4a8 / gguf folder, else the dense rows of before (f16; f32 in the f32 folder)."""
    return "w8a8" if recipe.get("embed") == "w8a8" and fmt in ("nvfp4", "w4a8", "gguf") else "dense"


def convert_tensors(src: ModelSource, fmt: str, recipe: dict[str, int],
                    log: Callable[[str], None] = lambda s: None) -> dict[str, np.ndarray]:
    """Apply the per-tensor rules of the module docstring; returns the safetensors dict."""
    if fmt not in FORMATS:
        raise ModelError(f"unknown weight format {fmt!r}; known formats: {', '.join(FORMATS)}")
    if fmt == "gguf":
        return convert_exact(src, recipe)
    tied = bool(src.meta["tie_word_embeddings"])
    rounded: dict[str, np.ndarray] = {}  # GPTQ's layer linears, by safetensors name
    if fmt in ("nvfp4", "w4a8") and recipe.get("rounding") == "gptq":
        try:
            from .quant.gptq import gptq_model  # torch: the pipeline's reference forward
        except ImportError as e:
            raise ModelError(f"{fmt}: rounding \"gptq\" runs the model over the calibration text with torch, "
                             f"which is not importable ({e}); install torch, or convert with --rounding mse") from None

        rounded = gptq_model(src, fmt, recipe, log)
    out: dict[str, np.ndarray] = {}
    for name, w in src.tensors():
        w = np.asarray(w)
        if name == "model.embed_tokens.weight":  # [V, H]
            emb8 = _embed_format(fmt, recipe) == "w8a8"
            if emb8:
                out.update(_quantize(name, w.astype(np.float32), "w8a8", recipe))
            else:
                out[name] = np.ascontiguousarray(w.astype(np.float32 if fmt == "f32" else np.float16))
            head = _head_format(fmt, recipe)
            if tied and fmt in ("nvfp4", "w4a8") and not (emb8 and head == "w8a8"):
                out.update(_quantize("lm_head.weight", w.astype(np.float32), head, recipe))
        elif _is_norm(name) or name.endswith(".bias"):  # [H] / [head_dim] / [N]
            out[name] = np.ascontiguousarray(w, dtype=np.float32)
        elif _is_linear(name):  # [N, K]
            if w.ndim != 2:
                raise ModelError(f"{src.source.get('file', src.name)}: tensor {name} has shape {w.shape}, expected 2-D")
            if tied and name == "lm_head.weight":
                continue  # tied: the embedding is the source of truth
            pre = name[: -len("weight")]
            got = {k: v for k, v in rounded.items() if k.startswith(pre + "weight.")}
            out.update(got or _quantize(name, w, _head_format(fmt, recipe) if name == "lm_head.weight" else fmt, recipe))
        else:
            raise ModelError(f"{src.source.get('file', src.name)}: unexpected tensor {name!r} {tuple(w.shape)}")
    return out


def _recipe_record(fmt: str, recipe: dict[str, int]) -> dict[str, Any]:
    """config.json's weights.recipe: the manifest recipe, plus "scales" for nvfp4/w4a8 (and for
    GPTQ the calibration text's name and sha256, so a changed text rebuilds the folder)."""
    if fmt not in ("nvfp4", "w4a8"):
        return dict(recipe)
    rec = dict(recipe, scales=SCALE_RECIPE)
    if recipe.get("rounding") == "gptq":
        from .quant.gptq import calibration_record

        rec["calibration"] = calibration_record()
    return rec


def build_config(src: ModelSource, fmt: str, recipe: dict[str, int]) -> dict[str, Any]:
    """config.json contents, keys in the order of docs/ENGINE.md."""
    missing = [k for k in CONFIG_KEYS if k not in src.meta]
    if missing:
        raise ModelError(f"{src.name}: converter produced no value for config keys {missing}")
    cfg: dict[str, Any] = {"format_version": FORMAT_VERSION, "model": src.name}
    cfg.update({k: src.meta[k] for k in CONFIG_KEYS})
    for k in OPTIONAL_CONFIG_KEYS:
        if src.meta.get(k) is not None:
            cfg[k] = src.meta[k]
    cfg["weights"] = {"format": fmt, "recipe": _recipe_record(fmt, recipe)}
    cfg["source"] = dict(src.source, converter_version=CONVERTER_VERSION)
    return cfg


def write_format(src: ModelSource, fmt: str, out_root: str | Path, recipe: dict[str, int],
                 log: Callable[[str], None] = lambda s: None) -> Path:
    """Write ``<out_root>/<src.name>/<fmt>/`` atomically (temp folder + rename); returns it."""
    from safetensors.numpy import save_file

    final = Path(out_root) / src.name / fmt
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{fmt}.partial-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        tensors = convert_tensors(src, fmt, recipe, log)
        save_file(tensors, str(tmp / "model.safetensors"),
                  metadata={"format": "pt", "kvdeck_format": fmt, "kvdeck_format_version": str(FORMAT_VERSION)})
        del tensors
        (tmp / "tokenizer.json").write_text(src.tokenizer_json, encoding="utf-8")
        cfg = build_config(src, fmt, recipe)
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        old = None
        if final.exists():
            old = final.parent / f".{fmt}.old-{os.getpid()}"
            if old.exists():
                shutil.rmtree(old)
            final.rename(old)
        tmp.rename(final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def write_model(src: ModelSource, formats: tuple[str, ...], out_root: str | Path,
                recipe: dict[str, int], log: Callable[[str], None] = lambda s: None) -> list[Path]:
    """Write every requested format folder; returns their paths.

    When the source is small (``f32_bytes`` < 2 GiB) and more than one format is asked for, the
    f32 tensors are materialised once and shared by all formats (dequantising a GGUF is not
    free); otherwise each format streams the source again.
    """
    paths = []
    if len(formats) > 1 and src.f32_bytes is not None and src.f32_bytes < 2 * 2**30:
        cached = list(src.tensors())  # [(name, f32 array)]
        src = ModelSource(src.name, src.meta, lambda: iter(cached), src.tokenizer_json, src.source, src.f32_bytes,
                          src.blocks)
    for fmt in formats:
        p = write_format(src, fmt, out_root, recipe, log)
        log(f"wrote {p} ({folder_size(p) / 2**20:.1f} MiB)")
        paths.append(p)
    return paths


def folder_size(folder: str | Path) -> int:
    """Total bytes of the regular files in a folder (not recursive)."""
    return sum(f.stat().st_size for f in Path(folder).iterdir() if f.is_file())


def read_folder_config(folder: str | Path) -> dict[str, Any]:
    """Read and validate ``<folder>/config.json`` of a kvdeck model folder.

    Raises ModelError naming config.json when it is missing, not JSON, or of an unknown
    format_version, and naming model.safetensors / tokenizer.json when they are missing.
    """
    folder = Path(folder)
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise ModelError(f"{cfg_path}: missing model config (no such file)")
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelError(f"{cfg_path}: not valid JSON: {e}") from None
    ver = cfg.get("format_version") if isinstance(cfg, dict) else None
    if ver != FORMAT_VERSION:
        raise ModelError(f"{cfg_path}: unknown format_version {ver!r}; this kvdeck reads format_version {FORMAT_VERSION}")
    for f in ("model.safetensors", "tokenizer.json"):
        if not (folder / f).is_file():
            raise ModelError(f"{folder / f}: missing (the model folder is incomplete)")
    from .safetensors_check import parse_header

    parse_header(folder / "model.safetensors")  # offsets, overlap, sizes: ModelError naming the tensor
    return cfg


def folder_is_current(folder: str | Path, fmt: str, recipe: dict[str, int], source_match: dict[str, Any]) -> bool:
    """True when ``folder`` is a complete folder of format ``fmt`` built by this converter version
    with ``recipe`` from the source whose config "source" record contains ``source_match``."""
    try:
        cfg = read_folder_config(folder)
    except ModelError:
        return False
    src = cfg.get("source", {})
    return (cfg.get("weights", {}).get("format") == fmt
            and cfg.get("weights", {}).get("recipe") == _recipe_record(fmt, recipe)
            and src.get("converter_version") == CONVERTER_VERSION
            and all(src.get(k) == v for k, v in source_match.items()))
