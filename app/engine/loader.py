"""Load a kvdeck model folder (docs/ENGINE.md) into the native engine.

`load_engine(path, weights=..., kv=...)` accepts a model root (`models/weights/<model>`,
with one sub-folder per weight format) or a format folder directly. Every problem with the
folder is an EngineError naming the file and what is wrong.
"""

from __future__ import annotations

import json
import math
import mmap
import os
from pathlib import Path

import numpy as np

from app.engine import _native
from app.engine.engine import Engine
from app.engine.errors import EngineError
from app.engine.folder_check import check_config_fields, check_weights
from app.engine.safetensors_header import SafetensorsHeader
from app.engine.types import ModelConfig

FORMAT_VERSION = 1
ARCHITECTURES = ("llama", "qwen2", "qwen3")
WEIGHT_FORMATS = ("nvfp4", "w4a8", "f16", "f32", "gguf")  # gguf: the GGUF source's own blocks
KV_FORMATS = ("f32", "f16", "nvfp4", "nvfp4r", "k8v4", "kpc4")
# Activations of the integer matmuls (kernels.h ActQ8): a8 int8 per 32 values, a16 int16 per 32
# (W4A8 / W8A8 weights, CPU backend). "auto": a16 for the exact GGUF import on the CPU (its
# weights are the source's own, so the activations' rounding is what is left), a8 otherwise.
ACTIVATIONS = ("auto", "a8", "a16")
# Bytes per K/V value at head_dim 64 (docs/ENGINE.md, KV formats): nvfp4 (32 + 4) / 64, nvfp4r
# (32 + 4 + 2) / 64, k8v4 K (64 + 2) and V nvfp4r (38) per 2 x 64 values, kpc4 K (40: 10 B per 16
# values of a channel's page) and V nvfp4 (36). kv_bytes_per_token is exact.
KV_BYTES = {"f32": 4.0, "f16": 2.0, "nvfp4": 0.5625, "nvfp4r": 0.59375, "k8v4": 0.8125, "kpc4": 0.59375}


def kv_bytes_per_token(kv: str, n_layers: int, n_kv: int, head_dim: int) -> int:
    """The pool's bytes per token (KvPool::bytes_per_token): K and V rows of every layer and KV head."""
    D = head_dim
    nv4 = D // 2 + D // 16
    k, v = {"f32": (4 * D, 4 * D), "f16": (2 * D, 2 * D), "nvfp4": (nv4, nv4), "nvfp4r": (nv4 + 2, nv4 + 2),
            "k8v4": (D + 2, nv4 + 2), "kpc4": (D * 5 // 8, nv4)}[kv]
    return n_layers * n_kv * (k + v)


def default_models_dir() -> Path:
    """Where `kvdeck models fetch` writes: $KVDECK_WEIGHTS or <checkout>/models/weights."""
    env = os.environ.get("KVDECK_WEIGHTS")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "models" / "weights"


def resolve_model_dir(path: str | os.PathLike, weights: str | None) -> Path:
    """A format folder from a model root + format, a format folder, or a model name."""
    p = Path(path)
    if not p.exists() and not p.is_absolute() and len(p.parts) == 1:
        p = default_models_dir() / p  # a bare model name such as "smollm2-135m"
    if not p.is_dir():
        raise EngineError(f"{p}: model folder not found (run `kvdeck models fetch smollm2-135m`)")
    if (p / "config.json").is_file():
        return p
    if weights is None:
        weights = "nvfp4"
    if weights not in WEIGHT_FORMATS:
        raise EngineError(f"weights '{weights}' is not a weight format ({', '.join(WEIGHT_FORMATS)})")
    sub = p / weights
    if not (sub / "config.json").is_file():
        have = sorted(d.name for d in p.iterdir() if (d / "config.json").is_file())
        raise EngineError(f"{sub}: no {weights} weights in {p} (found: {', '.join(have) or 'none'})")
    return sub


# ---- config.json ----------------------------------------------------------------------
def read_config(folder: Path) -> ModelConfig:
    f = folder / "config.json"
    try:
        raw = json.loads(f.read_text())
    except FileNotFoundError:
        raise EngineError(f"{f}: missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise EngineError(f"{f}: not valid JSON ({e})") from None
    check_config_fields(raw, f)  # folder_check.py: every field's type and range
    version = raw.get("format_version")
    if version != FORMAT_VERSION:
        raise EngineError(f"{f}: format_version {version!r} is not supported (this kvdeck reads {FORMAT_VERSION})")
    arch = raw.get("architecture")
    if arch not in ARCHITECTURES:
        raise EngineError(f"{f}: architecture {arch!r} is not supported ({', '.join(ARCHITECTURES)})")

    def need(key: str, kind: type):
        if key not in raw:
            raise EngineError(f"{f}: field '{key}' is missing")
        value = raw[key]
        if kind is float and isinstance(value, int):
            value = float(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise EngineError(f"{f}: field '{key}' should be {kind.__name__}, got {value!r}")
        return value

    hidden = need("hidden_size", int)
    heads = need("num_attention_heads", int)
    stop = raw.get("stop_token_ids") or ([raw["eos_token_id"]] if raw.get("eos_token_id") is not None else [])
    weights = raw.get("weights") or {}
    return ModelConfig(
        model=str(raw.get("model", folder.parent.name)),
        architecture=arch,
        hidden_size=hidden,
        intermediate_size=need("intermediate_size", int),
        num_hidden_layers=need("num_hidden_layers", int),
        num_attention_heads=heads,
        num_key_value_heads=need("num_key_value_heads", int),
        head_dim=int(raw.get("head_dim") or hidden // heads),
        vocab_size=need("vocab_size", int),
        rope_theta=need("rope_theta", float),
        rms_norm_eps=need("rms_norm_eps", float),
        max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        attention_bias=bool(raw.get("attention_bias", arch == "qwen2")),
        qk_norm=bool(raw.get("qk_norm", arch == "qwen3")),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_id=raw.get("eos_token_id"),
        stop_token_ids=tuple(int(t) for t in stop),
        chat_format=str(raw.get("chat_format", "generic")),
        weight_format=str(weights.get("format", folder.name)),
        rope_scaling=raw.get("rope_scaling"),
        chat_template=raw.get("chat_template") or "",  # null (no template) is "", not "None"
    )


def rope_inv_freq(cfg: ModelConfig) -> np.ndarray:
    """inv_freq f32 [head_dim/2] as Hugging Face computes it, with Llama 3 scaling if set.
    theta^(i/d) is the correctly rounded float32 (the C library's double pow, then rounded), as
    torch's powf gives it; numpy's vector powf is up to 2 ulp off on AVX-512 machines."""
    d = cfg.head_dim
    expo = np.arange(0, d, 2, dtype=np.float32) / np.float32(d)  # f32, as torch divides
    pw = np.array([math.pow(float(cfg.rope_theta), float(x)) for x in expo], np.float64).astype(np.float32)
    inv = (np.float32(1.0) / pw).astype(np.float32)
    rs = cfg.rope_scaling or {}
    kind = rs.get("rope_type", rs.get("type"))
    if kind == "llama3":
        factor = float(rs["factor"])
        low, high = float(rs.get("low_freq_factor", 1.0)), float(rs.get("high_freq_factor", 4.0))
        old = float(rs["original_max_position_embeddings"])
        low_wl, high_wl = old / low, old / high
        wl = 2 * np.pi / inv
        scaled = np.where(wl > low_wl, inv / factor, inv)
        smooth = (old / wl - low) / (high - low)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        is_mid = (wl >= high_wl) & (wl <= low_wl)
        inv = np.where(is_mid, mid, scaled).astype(np.float32)
    elif kind not in (None, "default"):
        raise EngineError(f"rope_scaling type {kind!r} is not supported (llama3)")
    return inv


# ---- tensors: mapped and uploaded one at a time (peak memory; issue 8) ----------------
# Peak host memory while loading is the engine's copy plus one tensor's mapped pages: the
# file is mmap'ed, each tensor is handed to the native WeightsBuilder (which copies it into
# engine memory with the GIL released) and its pages are dropped from the mapping right
# after (MADV_DONTNEED). Largest tensors go first, so the one-tensor overhead is that of a
# small tensor for most of the load (tests/unit/test_load_memory.py measures the peak).
NUMPY_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "U8": np.dtype("u1"), "I8": np.dtype("i1")}
DROP_ALIGN = 1 << 20  # page-aligned, and wider than the kernel's fault-around window (64 KiB)


def upload_tensors(native, header: SafetensorsHeader, tie_embeddings: bool) -> int:
    """Map the file of a validated `header` (safetensors_header.parse_header) and upload
    every tensor into `native` (an _native.Engine) through a WeightsBuilder, then install the
    weights. Returns the bytes uploaded. Mutates `native`; on error (EngineError naming the
    file and tensor) the engine should be discarded."""
    f = header.path
    builder = _native.WeightsBuilder(native, tie_embeddings)
    try:
        with open(f, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            if len(mm) != header.file_size:
                raise EngineError(f"{f}: changed while loading ({len(mm)} bytes, header read {header.file_size})")
            for e in sorted(header.tensors.values(), key=lambda e: e.begin - e.end):  # largest first
                dtype = NUMPY_DTYPES.get(e.dtype)
                if dtype is None:
                    raise EngineError(f"{f}: tensor {e.name}: dtype {e.dtype} is not one the engine reads "
                                      f"({', '.join(NUMPY_DTYPES)})")
                arr = np.frombuffer(mm, dtype, (e.end - e.begin) // dtype.itemsize, e.begin).reshape(e.shape)
                try:
                    builder.add(e.name, arr)
                finally:
                    del arr  # the mapping cannot close while a view exports it
                # Drop the tensor's pages from the mapping, and the neighbours that the
                # kernel's fault-around mapped with them (they re-fault if needed later).
                lo, hi = e.begin // DROP_ALIGN * DROP_ALIGN, -(-e.end // DROP_ALIGN) * DROP_ALIGN
                mm.madvise(mmap.MADV_DONTNEED, lo, min(hi, len(mm)) - lo)
        builder.finish()
    except ValueError as err:
        raise EngineError(f"{f}: {err}") from None
    except OSError as err:
        raise EngineError(f"{f}: unreadable ({err})") from None
    return builder.uploaded_bytes


def upload_arrays(native, tensors: dict[str, np.ndarray], tie_embeddings: bool) -> int:
    """Upload in-memory arrays (tests, tiny random models) the way upload_tensors uploads a
    file. Raises ValueError naming the tensor. Returns the bytes uploaded."""
    builder = _native.WeightsBuilder(native, tie_embeddings)
    for name in sorted(tensors):
        builder.add(name, np.ascontiguousarray(tensors[name]))
    builder.finish()
    return builder.uploaded_bytes


# ---- end of the tensor section ---------------------------------------------------------
def read_tokenizer(folder: Path):
    from tokenizers import Tokenizer

    f = folder / "tokenizer.json"
    if not f.is_file():
        raise EngineError(f"{f}: missing")
    try:
        return Tokenizer.from_file(str(f))
    except Exception as e:  # tokenizers raises a bare Exception on malformed files
        raise EngineError(f"{f}: not a valid tokenizers file ({e})") from None


# ---- engine ---------------------------------------------------------------------------
def check_options(*, threads, kv_pages, max_context, kv_mib, kv_block, max_chunk) -> None:
    """EngineError naming the first engine option out of range (the native constructor
    checks the same ranges again)."""

    def need(ok: bool, name: str, value, rule: str) -> None:
        if not ok:
            raise EngineError(f"engine option {name} = {value!r} is out of range ({rule})")

    def is_int(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    need(threads is None or (is_int(threads) and 0 <= threads <= 1024), "threads", threads,
         "0 or None for all cores, or 1..1024")
    need(kv_pages is None or (is_int(kv_pages) and kv_pages >= 1), "kv_pages", kv_pages, ">= 1 page, or None")
    need(kv_mib is None or (isinstance(kv_mib, (int, float)) and kv_mib > 0), "kv_mib", kv_mib, "> 0 MiB, or None")
    need(is_int(max_context) and max_context >= 1, "max_context", max_context, ">= 1 token")
    need(is_int(kv_block) and 1 <= kv_block <= 256, "kv_block", kv_block, "1..256 tokens per page")
    need(is_int(max_chunk) and 1 <= max_chunk <= 16384, "max_chunk", max_chunk, "1..16384 tokens")


def resolve_activations(activations: str, weight_format: str, device: str) -> str:
    """"auto" -> a16 for gguf folders on the CPU, else a8; "a8" / "a16" as given."""
    if activations != "auto":
        return activations
    return "a16" if weight_format == "gguf" and device == "cpu" else "a8"


def load_engine(
    path: str | os.PathLike,
    weights: str | None = None,
    kv: str = "f32",
    threads: int | None = None,
    kv_pages: int | None = None,
    max_context: int = 4096,
    prefix_cache: bool = True,
    kv_mib: float | None = None,
    kv_block: int = 16,
    max_chunk: int = 512,
    device: str = "cpu",
    activations: str = "auto",
) -> Engine:
    """Load a model folder onto a backend (`device`: "cpu", or "cuda" where built and a GPU is
    present). See module docstring for `path`.

    The KV pool holds `kv_pages` pages of 16 tokens, or `kv_mib` MiB of KV, or (neither
    given) enough for `max_context` tokens; its memory never grows past that.
    """
    if kv not in KV_FORMATS:
        raise EngineError(f"kv format '{kv}' is not supported ({', '.join(KV_FORMATS)})")
    if activations not in ACTIVATIONS:
        raise EngineError(f"engine option activations = {activations!r} is not supported ({', '.join(ACTIVATIONS)})")
    check_options(threads=threads, kv_pages=kv_pages, max_context=max_context, kv_mib=kv_mib,
                  kv_block=kv_block, max_chunk=max_chunk)
    folder = resolve_model_dir(path, weights)
    cfg = read_config(folder)
    header = check_weights(folder / "model.safetensors", cfg)  # folder_check.py: tensors vs config
    tokenizer = read_tokenizer(folder)
    native_cfg = {
        "hidden": cfg.hidden_size,
        "intermediate": cfg.intermediate_size,
        "n_layers": cfg.num_hidden_layers,
        "n_heads": cfg.num_attention_heads,
        "n_kv_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "vocab": cfg.vocab_size,
        "rms_eps": cfg.rms_norm_eps,
        "attn_bias": cfg.attention_bias,
        "qk_norm": cfg.qk_norm,
        "rope_inv_freq": rope_inv_freq(cfg).tolist(),
    }
    if kv_mib is not None:
        if kv_pages is not None:
            raise EngineError("give kv_pages or kv_mib, not both")
        per_page = kv_bytes_per_token(kv, cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim) * kv_block
        kv_pages = int(kv_mib * 2**20 // per_page)
        if kv_pages < 1:
            raise EngineError(f"kv_mib {kv_mib} is smaller than one page ({per_page / 2**20:.3f} MiB)")
    options = {
        "backend": device,
        "kv": kv,
        "threads": threads or 0,
        "kv_pages": kv_pages or 0,
        "max_context": max_context,
        "prefix_cache": prefix_cache,
        "kv_block": kv_block,
        "max_chunk": max_chunk,
        "activations": resolve_activations(activations, cfg.weight_format, device),
    }
    try:
        native = _native.Engine(native_cfg, options)
    except ValueError as e:
        if device != "cpu" and ("not available in this build" in str(e) or "activations" in str(e)
                              or "cpu backend only" in str(e)):
            raise EngineError(f"device {device!r}: {e}") from None
        raise EngineError(f"{folder / 'model.safetensors'}: {e}") from None
    except RuntimeError as e:  # "no CUDA device: <the driver's reason>"
        raise EngineError(f"device {device!r}: {e}") from None
    upload_tensors(native, header, cfg.tie_word_embeddings)  # tensor by tensor (peak memory)
    return Engine(native, cfg, tokenizer, folder, prefix_cache=prefix_cache)
