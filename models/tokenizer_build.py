"""Tokenizer and chat-format metadata.

* :func:`build_bpe_tokenizer` turns a GGUF byte-level BPE vocabulary ("gpt2" tokenizer model:
  tokens, merges, token types, pre-tokenizer name) into a Hugging Face ``tokenizers.Tokenizer``
  equivalent to the model's original ``tokenizer.json``.
* :func:`detect_chat_format` and :func:`stop_token_ids` derive kvdeck's ``chat_format`` and
  ``stop_token_ids`` config fields from the chat template and the special tokens.

Contract of the built tokenizer: no normalizer (NFC for qwen2), the pre-tokenizer the GGUF's
``tokenizer.ggml.pre`` names, a ByteLevel decoder, no post-processor (no BOS is added: the chat
template carries every special token), every control token (type 3) an added *special* token and
every user-defined token (type 4) an added non-special token, both matched whole (one id each)
before BPE; ``decode(encode(s)) == s`` for any text.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from .errors import ModelError

__all__ = ["build_bpe_tokenizer", "detect_chat_format", "stop_token_ids", "SUPPORTED_PRE"]

# GGUF token types (llama.cpp's llama_token_type).
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

_LLAMA3_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
              r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

SUPPORTED_PRE = ("smollm", "gpt2", "default", "llama-bpe", "llama3", "qwen2")


def _pre_tokenizer(pre: str):
    """(normalizer or None, pre-tokenizer) for a llama.cpp pre-tokenizer name."""
    if pre == "smollm":
        # HF SmolLM2 tokenizer.json: Digits(individual) then GPT-2 regex ByteLevel.
        return None, pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    if pre in ("gpt2", "default"):
        return None, pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if pre in ("llama-bpe", "llama3"):
        return None, pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_LLAMA3_PAT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    if pre == "qwen2":
        return normalizers.NFC(), pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_QWEN2_PAT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    raise ModelError(f"unsupported GGUF pre-tokenizer {pre!r}; supported: {', '.join(SUPPORTED_PRE)}")


def build_bpe_tokenizer(tokens: Sequence[str], merges: Iterable[str], token_types: Sequence[int],
                        pre: str, *, where: str = "GGUF") -> Tokenizer:
    """Build a byte-level BPE tokenizer.

    tokens: the vocabulary, id = index (byte-level strings, e.g. "Ġthe").
    merges: "left right" strings, rank = index.
    token_types: GGUF token type per id (3 control, 4 user-defined become added tokens).
    pre: llama.cpp pre-tokenizer name (``tokenizer.ggml.pre``).
    where: the file name, for error messages.
    """
    if len(token_types) != len(tokens):
        raise ModelError(f"{where}: {len(tokens)} tokens but {len(token_types)} token types")
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    merge_pairs: list[tuple[str, str]] = []
    for m in merges:
        a, sep, b = m.partition(" ")
        if not sep:
            raise ModelError(f"{where}: malformed BPE merge {m!r} (expected 'left right')")
        merge_pairs.append((a, b))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merge_pairs, dropout=None, unk_token=None,
                               fuse_unk=False, byte_fallback=False))
    norm, pre_tok = _pre_tokenizer(pre)
    if norm is not None:
        tok.normalizer = norm
    tok.pre_tokenizer = pre_tok
    tok.decoder = decoders.ByteLevel()
    special = [AddedToken(tokens[i], special=True, normalized=False, single_word=False,
                          lstrip=False, rstrip=False)
               for i, t in enumerate(token_types) if t == TOKEN_CONTROL]
    user = [AddedToken(tokens[i], special=False, normalized=False, single_word=False,
                       lstrip=False, rstrip=False)
            for i, t in enumerate(token_types) if t == TOKEN_USER_DEFINED]
    if special:
        tok.add_special_tokens(special)
    if user:
        tok.add_tokens(user)
    for at in special + user:  # added tokens must keep their GGUF ids
        if tok.token_to_id(at.content) != vocab[at.content]:
            raise ModelError(f"{where}: added token {at.content!r} did not keep id {vocab[at.content]}")
    return tok


def detect_chat_format(template: str | None) -> str:
    """"chatml" if the template uses <|im_start|>, "llama3" for <|start_header_id|>, else "generic"."""
    if not template:
        return "generic"
    if "<|im_start|>" in template:
        return "chatml"
    if "<|start_header_id|>" in template:
        return "llama3"
    return "generic"


_FORMAT_STOPS = {
    "chatml": ("<|im_end|>",),
    "llama3": ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"),
    "generic": (),
}


def stop_token_ids(chat_format: str, eos_ids: Iterable[int], token_to_id) -> list[int]:
    """eos ids plus the chat format's end-of-turn tokens that exist in the vocabulary; sorted, unique.

    token_to_id: callable str -> int | None (e.g. ``Tokenizer.token_to_id``).
    """
    ids = {int(i) for i in eos_ids if i is not None}
    for t in _FORMAT_STOPS.get(chat_format, ()):
        i = token_to_id(t)
        if i is not None:
            ids.add(int(i))
    return sorted(ids)
