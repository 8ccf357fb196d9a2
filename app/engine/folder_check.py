"""Checks of a kvdeck model folder before anything is uploaded (docs/ENGINE.md, format 1).

Two entry points, both raising :class:`~app.engine.errors.EngineError` naming the file and the
field or tensor at fault, both pure (they read files, mutate nothing):

* :func:`check_config_fields` — the parsed config.json object: every field the loader uses has
  the right type and range (sizes positive int32, head counts divide, head_dim even, rope_theta /
  rms_norm_eps positive finite, token ids inside the vocabulary, llama3 rope_scaling complete).
  loader.read_config calls it first, so its own reads never meet a malformed value.
* :func:`check_weights` — model.safetensors against the config: the header passes
  app/engine/safetensors_header.py, and the tensor set is exactly the one the config implies
  (names, dtypes, shapes per weight format; no tensor the config does not account for, such as
  an extra layer or a bias the config switches off), and the layers' linears are all of the
  folder's weight format. Forms the native loader may learn later (other ``X.weight.*`` names)
  pass through to it. Returns the validated header.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from app.engine.errors import EngineError
from app.engine.safetensors_header import SafetensorsHeader, TensorEntry, parse_header
from app.engine.types import ModelConfig

__all__ = ["check_config_fields", "check_weights"]

_MAX_DIM = 2**31 - 1
_SIZES = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "vocab_size")
_QUANT_PAD = 32  # K is padded to a multiple of 32 in nvfp4 / w4a8 codes
_NVFP4_BLOCK = 16


# ---- config.json ----------------------------------------------------------------------------
def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _positive_number(v: Any) -> bool:
    """A positive int or float that is finite as a float64 (10**400 is not)."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return False
    return v > 0 and v <= 1.7e308 and math.isfinite(v)


def check_config_fields(raw: Any, f: Path) -> None:
    """Raise EngineError naming ``f`` and the field unless ``raw`` is a usable config object."""
    if not isinstance(raw, dict):
        raise EngineError(f"{f}: not a JSON object")

    def bad(key: str, rule: str) -> EngineError:
        return EngineError(f"{f}: field '{key}' should be {rule}, got {raw.get(key)!r}")

    for key in _SIZES:
        if key in raw and not (_is_int(raw[key]) and 1 <= raw[key] <= _MAX_DIM):
            raise bad(key, f"an integer in [1, {_MAX_DIM}]")
    if raw.get("head_dim") is not None and not (_is_int(raw["head_dim"]) and 1 <= raw["head_dim"] <= _MAX_DIM):
        raise bad("head_dim", f"an integer in [1, {_MAX_DIM}]")  # null: hidden_size / heads
    m = raw.get("max_position_embeddings", 1)
    if not (_is_int(m) and 1 <= m <= _MAX_DIM):
        raise bad("max_position_embeddings", f"an integer in [1, {_MAX_DIM}]")
    if "rope_theta" in raw and not (_positive_number(raw["rope_theta"]) and raw["rope_theta"] > 1):
        raise bad("rope_theta", "a finite number above 1 (RoPE frequencies theta^(-2i/d))")
    if "rms_norm_eps" in raw and not (_positive_number(raw["rms_norm_eps"]) and 1e-30 < raw["rms_norm_eps"] <= 1):
        raise bad("rms_norm_eps", "a number in (1e-30, 1] (it is added in float32)")
    for key in ("tie_word_embeddings", "attention_bias", "qk_norm"):
        if raw.get(key) is not None and not isinstance(raw[key], bool):
            raise bad(key, "true or false")
    for key in ("model", "chat_format"):
        if key in raw and not isinstance(raw[key], str):
            raise bad(key, "a string")
    if raw.get("chat_template") is not None and not isinstance(raw["chat_template"], str):
        raise bad("chat_template", "a string or null")
    if raw.get("weights") is not None and not (isinstance(raw["weights"], dict)
                                                and isinstance(raw["weights"].get("format", ""), str)):
        raise bad("weights", "an object with a string 'format'")
    heads, kv, hidden = raw.get("num_attention_heads"), raw.get("num_key_value_heads"), raw.get("hidden_size")
    if _is_int(heads) and _is_int(kv) and heads % kv:
        raise EngineError(f"{f}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
    if raw.get("head_dim") is None and _is_int(heads) and _is_int(hidden) and hidden % heads:
        raise EngineError(f"{f}: hidden_size {hidden} is not a multiple of num_attention_heads {heads} "
                          f"and no head_dim is given")
    head_dim = raw.get("head_dim") or (hidden // heads if _is_int(hidden) and _is_int(heads) else 2)
    if head_dim % 2:
        raise EngineError(f"{f}: head_dim {head_dim} must be even (RoPE rotates pairs)")
    _check_token_ids(raw, f)
    _check_rope_scaling(raw.get("rope_scaling"), f)


def _check_token_ids(raw: dict, f: Path) -> None:
    vocab = raw.get("vocab_size") if _is_int(raw.get("vocab_size")) else _MAX_DIM
    for key in ("bos_token_id", "eos_token_id"):
        v = raw.get(key)
        if v is not None and not (_is_int(v) and 0 <= v < vocab):
            raise EngineError(f"{f}: field '{key}' should be a token id in [0, {vocab}), got {v!r}")
    stop = raw.get("stop_token_ids")
    if stop is not None and not (isinstance(stop, list) and all(_is_int(t) and 0 <= t < vocab for t in stop)):
        raise EngineError(f"{f}: field 'stop_token_ids' should be a list of token ids in [0, {vocab}), "
                          f"got {stop!r}")


def _check_rope_scaling(rs: Any, f: Path) -> None:
    if rs is None:
        return
    if not isinstance(rs, dict):
        raise EngineError(f"{f}: field 'rope_scaling' should be an object, got {rs!r}")
    kind = rs.get("rope_type", rs.get("type"))
    if kind in (None, "default"):
        return
    if kind != "llama3":
        raise EngineError(f"{f}: rope_scaling type {kind!r} is not supported (llama3)")
    for key in ("factor", "original_max_position_embeddings"):
        if not (_positive_number(rs.get(key)) and rs[key] >= 1):
            raise EngineError(f"{f}: rope_scaling field '{key}' should be a finite number >= 1, "
                              f"got {rs.get(key)!r}")
    low, high = rs.get("low_freq_factor", 1.0), rs.get("high_freq_factor", 4.0)
    if not (_positive_number(low) and _positive_number(high) and high > low):
        raise EngineError(f"{f}: rope_scaling needs 0 < low_freq_factor < high_freq_factor, "
                          f"got {low!r} and {high!r}")


# ---- model.safetensors against the config ---------------------------------------------------
def _want(h: SafetensorsHeader, name: str, dtypes: tuple[str, ...], shape: tuple[int, ...]) -> TensorEntry:
    e = h.tensors.get(name)
    if e is None:
        raise EngineError(f"{h.path}: tensor {name} is missing")
    if e.dtype not in dtypes:
        raise EngineError(f"{h.path}: tensor {name} has dtype {e.dtype}, expected {' or '.join(dtypes)}")
    if e.shape != shape:
        raise EngineError(f"{h.path}: tensor {name} has shape {list(e.shape)}, config.json implies {list(shape)}")
    return e


_KNOWN_FORMS = {  # suffixes after "X.weight" -> format (docs/ENGINE.md)
    frozenset({""}): "dense",
    frozenset({".codes", ".scales", ".tscale"}): "nvfp4",
    frozenset({".codes", ".scales"}): "w4a8",  # or w8a8 when the codes are I8
    frozenset({".codes", ".scales", ".mins"}): "w4a8",  # GGUF Q4_1 kept exactly (group 32)
}


def _linear(h: SafetensorsHeader, p: str, N: int, K: int) -> tuple[str, list[str]]:
    """The linear ``p`` [N, K] in whichever form the file holds -> (format, its tensor names).

    The forms of docs/ENGINE.md are checked here in full; a combination of ``p.weight.*`` names
    that is none of them (a form added to the native loader later) is returned as "other" and
    left to the native loader, which checks every tensor it reads."""
    w = p + ".weight"
    names = [n for n in h.tensors if n == w or n.startswith(w + ".")]
    if not names:
        raise EngineError(f"{h.path}: tensor {w} (or {w}.codes) is missing")
    form = _KNOWN_FORMS.get(frozenset(n[len(w):] for n in names), "other")
    if form == "dense":
        return _want(h, w, ("F32", "F16"), (N, K)).dtype.lower(), names
    if form == "other":
        return form, names
    Kp = -(-K // _QUANT_PAD) * _QUANT_PAD
    if form == "w4a8" and h.tensors[w + ".codes"].dtype == "I8" and w + ".mins" not in h.tensors:
        _want(h, w + ".codes", ("I8",), (N, Kp))  # w8a8: GGUF Q8_0 kept exactly
        _want(h, w + ".scales", ("F16",), (N, Kp // _QUANT_PAD))
        return "w8a8", names
    _want(h, w + ".codes", ("U8",), (N, Kp // 2))
    if form == "nvfp4":
        _want(h, w + ".scales", ("U8",), (N, Kp // _NVFP4_BLOCK))
        _want(h, w + ".tscale", ("F32",), (1,))
        return form, names
    s = h.tensors[w + ".scales"]
    groups = s.shape[1] if len(s.shape) == 2 else 0
    if groups < 1 or Kp % groups or (Kp // groups) % 2:
        raise EngineError(f"{h.path}: tensor {w}.scales has shape {list(s.shape)}: need [{N}, G] with "
                          f"G dividing Kp={Kp} into even groups")
    _want(h, w + ".scales", ("F16",), (N, groups))
    if w + ".mins" in h.tensors:
        if groups * _QUANT_PAD != Kp:
            raise EngineError(f"{h.path}: tensor {w}.mins needs group 32 scales, {w}.scales has {groups} groups")
        _want(h, w + ".mins", ("F16",), (N, groups))
    return form, names


def check_weights(f: Path, cfg: ModelConfig) -> SafetensorsHeader:
    """Validate ``f`` (model.safetensors) against ``cfg``; see module docstring."""
    h = parse_header(f)
    H, F, D, V = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim, cfg.vocab_size
    QD, KD = cfg.num_attention_heads * D, cfg.num_key_value_heads * D
    used = ["model.norm.weight"]
    _want(h, "model.norm.weight", ("F32",), (H,))
    fmt, names = _linear(h, "model.embed_tokens", V, H)
    if fmt not in ("f32", "f16", "w8a8", "other"):
        raise EngineError(f"{f}: model.embed_tokens.weight is {fmt}; the embedding must be f32 or f16 rows, "
                          f"or w8a8 (int8 codes, f16 scale per 32)")
    used += names
    linears = []  # (format, name) of the layers' linears
    if any(n.startswith("lm_head.weight") for n in h.tensors):
        used += _linear(h, "lm_head", V, H)[1]
    elif not cfg.tie_word_embeddings:
        raise EngineError(f"{f}: tensor lm_head.weight is missing and config.json does not tie the embeddings")
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        for n in ("input_layernorm.weight", "post_attention_layernorm.weight"):
            _want(h, p + n, ("F32",), (H,))
            used.append(p + n)
        for n, N, K in (("self_attn.q_proj", QD, H), ("self_attn.k_proj", KD, H), ("self_attn.v_proj", KD, H),
                        ("self_attn.o_proj", H, QD), ("mlp.gate_proj", F, H), ("mlp.up_proj", F, H),
                        ("mlp.down_proj", H, F)):
            fmt, names = _linear(h, p + n, N, K)
            linears.append((fmt, p + n))
            used += names
        if cfg.attention_bias:
            for n, N in (("q", QD), ("k", KD), ("v", KD)):
                used.append(_want(h, p + f"self_attn.{n}_proj.bias", ("F32",), (N,)).name)
        if cfg.qk_norm:
            for n in ("q_norm", "k_norm"):
                used.append(_want(h, p + f"self_attn.{n}.weight", ("F32",), (D,)).name)
    extra = [n for n in h.tensors if n not in set(used)]
    if extra:
        shown = ", ".join(extra[:4]) + (f" (+{len(extra) - 4} more)" if len(extra) > 4 else "")
        raise EngineError(f"{f}: tensors {shown} are not part of the model config.json describes "
                          f"({cfg.num_hidden_layers} layers, attention_bias={cfg.attention_bias}, "
                          f"qk_norm={cfg.qk_norm})")
    if cfg.weight_format in ("nvfp4", "w4a8", "f16", "f32"):
        odd = [(fmt, n) for fmt, n in linears if fmt not in (cfg.weight_format, "other")]
        if odd:
            raise EngineError(f"{f}: linear {odd[0][1]} is {odd[0][0]}, but config.json says the weights "
                              f"are {cfg.weight_format}")
    return h
