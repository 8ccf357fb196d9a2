"""A Hugging Face ``config.json`` read into checked values, and the tensor shapes it implies.

:func:`read_hf_config` turns the JSON object into an :class:`HfConfig` (frozen) or raises a
:class:`~models.errors.ModelError` naming config.json and the field: sizes are positive integers,
head counts divide, head_dim is even, rope_theta / rms_norm_eps are positive finite numbers,
token ids are non-negative integers, Llama 3 rope_scaling has its four numbers in range.
:func:`expected_shapes` gives the shape every tensor must have, so that a checkpoint whose
header lies about a shape is refused before any tensor is converted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ModelError

__all__ = ["ARCHITECTURES", "HfConfig", "read_hf_config", "expected_shapes"]

ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}
_MAX_DIM = 2**31 - 1  # the engine's sizes are int32


@dataclass(frozen=True)
class HfConfig:
    """The checked fields of a HF config (``vocab_size`` None when the config omits it)."""

    arch_name: str
    arch: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int | None
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    rope_scaling: dict[str, Any] | None
    bos_token_ids: list[int]
    eos_token_ids: list[int]


# ---- field readers ------------------------------------------------------------------------
def _int(hf: dict, key: str, path: Path, default: int | None = None, minimum: int = 1) -> int:
    v = hf.get(key, default)
    if v is None:
        raise ModelError(f"{path}: field '{key}' is missing")
    if not isinstance(v, int) or isinstance(v, bool) or not minimum <= v <= _MAX_DIM:
        raise ModelError(f"{path}: field '{key}' should be an integer in [{minimum}, {_MAX_DIM}], got {v!r}")
    return v


def _pos_float(v: Any, key: str, path: Path, above: float = 0.0, most: float = math.inf) -> float:
    if (not isinstance(v, (int, float)) or isinstance(v, bool) or not above < v <= min(most, 1.7e308)
            or not math.isfinite(v)):  # the range test first: math.isfinite(10**400) overflows
        rng = f"a finite number above {above:g}" + (f" and at most {most:g}" if most < math.inf else "")
        raise ModelError(f"{path}: field '{key}' should be {rng}, got {v!r}")
    return float(v)


def token_ids(v: Any, key: str, path: Path) -> list[int]:
    """None, an id or a list of ids -> list of non-negative ints; else ModelError naming key."""
    items = [] if v is None else v if isinstance(v, list) else [v]
    if not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= _MAX_DIM for x in items):
        raise ModelError(f"{path}: field '{key}' should be a token id or a list of them, got {v!r}")
    return list(items)


def _rope_scaling(hf: dict, path: Path) -> dict[str, Any] | None:
    """transformers 4.x `rope_scaling` or 5.x `rope_parameters` -> None (plain RoPE) or a
    checked llama3 record; other scaling kinds are refused (the engine has only llama3)."""
    rope = hf.get("rope_parameters") or {}
    if not isinstance(rope, dict):
        raise ModelError(f"{path}: field 'rope_parameters' should be an object, got {rope!r}")
    scaling = hf.get("rope_scaling")
    if scaling is None and rope.get("rope_type", "default") != "default":
        scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    if scaling is None:
        return None
    if not isinstance(scaling, dict):
        raise ModelError(f"{path}: field 'rope_scaling' should be an object, got {scaling!r}")
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in ("default", None):
        return None
    if kind != "llama3":
        raise ModelError(f"{path}: rope_scaling type {kind!r} is not supported (llama3)")
    for k in ("factor", "original_max_position_embeddings"):
        if k not in scaling:
            raise ModelError(f"{path}: rope_scaling field '{k}' is missing")
        if _pos_float(scaling[k], f"rope_scaling.{k}", path) < 1:
            raise ModelError(f"{path}: rope_scaling field '{k}' should be >= 1, got {scaling[k]!r}")
    low = _pos_float(scaling.get("low_freq_factor", 1.0), "rope_scaling.low_freq_factor", path)
    high = _pos_float(scaling.get("high_freq_factor", 4.0), "rope_scaling.high_freq_factor", path)
    if high <= low:
        raise ModelError(f"{path}: rope_scaling high_freq_factor {high} must exceed low_freq_factor {low}")
    return scaling


# ---- the config -----------------------------------------------------------------------------
def read_hf_config(hf: Any, path: Path) -> HfConfig:
    """Check the parsed config.json object ``hf`` (from file ``path``); see module docstring."""
    if not isinstance(hf, dict):
        raise ModelError(f"{path}: config is not a JSON object")
    archs = hf.get("architectures") or []
    if not isinstance(archs, list):
        archs = [archs]
    arch_name = next((a for a in archs if isinstance(a, str) and a in ARCHITECTURES), None)
    if arch_name is None:
        shown = ", ".join(map(str, archs)) or str(hf.get("model_type"))
        raise ModelError(f"{path}: unsupported architecture {shown}; supported: {', '.join(ARCHITECTURES)}")
    arch = ARCHITECTURES[arch_name]
    if hf.get("mlp_bias"):
        raise ModelError(f"{path}: mlp_bias=true is not supported by kvdeck's {arch} forward pass")
    if arch == "qwen2" and hf.get("use_sliding_window"):
        raise ModelError(f"{path}: use_sliding_window=true is not supported")
    hidden = _int(hf, "hidden_size", path)
    heads = _int(hf, "num_attention_heads", path)
    kv = _int(hf, "num_key_value_heads", path, default=heads)
    if heads % kv:
        raise ModelError(f"{path}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
    if hf.get("head_dim") is None and hidden % heads:
        raise ModelError(f"{path}: hidden_size {hidden} is not a multiple of num_attention_heads {heads} "
                         f"(and no head_dim is given)")
    head_dim = _int(hf, "head_dim", path, default=hidden // heads)
    if head_dim % 2:
        raise ModelError(f"{path}: head_dim {head_dim} must be even (RoPE rotates pairs)")
    vocab = _int(hf, "vocab_size", path) if hf.get("vocab_size") is not None else None
    rope = hf.get("rope_parameters") if isinstance(hf.get("rope_parameters"), dict) else {}
    tied = hf.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        raise ModelError(f"{path}: field 'tie_word_embeddings' should be true or false, got {tied!r}")
    return HfConfig(
        arch_name=arch_name, arch=arch, hidden_size=hidden,
        intermediate_size=_int(hf, "intermediate_size", path),
        num_hidden_layers=_int(hf, "num_hidden_layers", path),
        num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim, vocab_size=vocab,
        rope_theta=_pos_float(hf.get("rope_theta", rope.get("rope_theta", 10000.0)), "rope_theta", path, above=1),
        rms_norm_eps=_pos_float(hf.get("rms_norm_eps", 1e-6), "rms_norm_eps", path, above=1e-30, most=1),
        max_position_embeddings=_int(hf, "max_position_embeddings", path, default=2048),
        tie_word_embeddings=tied,
        rope_scaling=_rope_scaling(hf, path),
        bos_token_ids=token_ids(hf.get("bos_token_id"), "bos_token_id", path),
        eos_token_ids=token_ids(hf.get("eos_token_id"), "eos_token_id", path),
    )


def expected_shapes(c: HfConfig, vocab: int, bias: bool, qk_norm: bool) -> dict[str, tuple[int, ...]]:
    """HF name -> shape of every tensor the checkpoint must hold (lm_head only when untied)."""
    H, F, D = c.hidden_size, c.intermediate_size, c.head_dim
    QD, KD = c.num_attention_heads * D, c.num_key_value_heads * D
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, H), "model.norm.weight": (H,)}
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (vocab, H)
    for i in range(c.num_hidden_layers):
        L = f"model.layers.{i}."
        shapes[L + "input_layernorm.weight"] = (H,)
        shapes[L + "post_attention_layernorm.weight"] = (H,)
        for x, n in (("q", QD), ("k", KD), ("v", KD)):
            shapes[L + f"self_attn.{x}_proj.weight"] = (n, H)
            if bias:
                shapes[L + f"self_attn.{x}_proj.bias"] = (n,)
        shapes[L + "self_attn.o_proj.weight"] = (H, QD)
        if qk_norm:
            shapes[L + "self_attn.q_norm.weight"] = (D,)
            shapes[L + "self_attn.k_norm.weight"] = (D,)
        shapes[L + "mlp.gate_proj.weight"] = (F, H)
        shapes[L + "mlp.up_proj.weight"] = (F, H)
        shapes[L + "mlp.down_proj.weight"] = (H, F)
    return shapes
