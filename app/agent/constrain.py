"""Constrained tool calls: llguidance grammars over the tool schemas, as engine TokenConstraints.

The grammar for a call is the format's opener, then one JSON object — anyOf the tools'
{"name": const, "arguments": <parameters schema>} — then the closer. It is kept tight so a
135M model still closes its call: no flexible whitespace (exact separators), additionalProperties
false, bounded strings (maxLength), enums.

tool_choice:
- "required": the whole reply is constrained to one call of any tool;
- NAME: the whole reply is one call of that tool;
- "auto": the model writes freely (no mask, no cost) and the constraint switches on once the
  text contains the call opener (TriggeredConstraint). Why not a grammar `text | call` from the
  first token: free text under a grammar pays a mask per token for every plain answer, and with
  an opener that is plain text (SmolLM2) the `text` branch can swallow "<tool_call>" and leave the
  call unconstrained unless TEXT is written with a costly negation; a trigger is exact and free.
- "none": no constraint, and calls in the reply are not executed.

Vocab sizes: the mask covers the model's vocab (config.vocab_size); tokens the tokenizer does
not know (padding rows of the embedding) are never allowed, and tokens beyond the model's vocab
are dropped.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np

from app.agent.parse import CallFormat

_LLT_CACHE: dict[int, tuple[object, object]] = {}


def ll_tokenizer(tokenizer, vocab_size: int, eos_ids: list[int]):
    """An llguidance LLTokenizer for an HF `tokenizers.Tokenizer` (built once, ~1 s, cached)."""
    import llguidance

    hit = _LLT_CACHE.get(id(tokenizer))
    if hit is not None and hit[0] is tokenizer:
        return hit[1]
    n = max(vocab_size, tokenizer.get_vocab_size(with_added_tokens=True))
    llt = llguidance.LLTokenizer(tokenizer.to_str(), n_vocab=n, eos_token=list(eos_ids))
    _LLT_CACHE[id(tokenizer)] = (tokenizer, llt)
    return llt


def call_schema(tools: list[dict], fmt: CallFormat) -> dict:
    """The JSON schema of one call object over `tools` (each {name, description, parameters})."""
    alts = [
        {
            "type": "object",
            "properties": {"name": {"const": t["name"]}, fmt.args_key: t["parameters"]},
            "required": ["name", fmt.args_key],
            "additionalProperties": False,
        }
        for t in tools
    ]
    schema = alts[0] if len(alts) == 1 else {"anyOf": alts}
    return schema | {"x-guidance": {"whitespace_flexible": False, "item_separator": fmt.item_separator,
                                    "key_separator": fmt.key_separator, "lenient": True}}


def _lark_piece(text: str, tokenizer) -> str:
    """A literal for the grammar: a special token as <tok> where the tokenizer has one, else a string."""
    if not text:
        return ""
    core = text.strip()
    tid = tokenizer.token_to_id(core)
    if tid is not None and core == text:
        return f"<[{tid}]>"
    return json.dumps(text)


def call_grammar(tools: list[dict], fmt: CallFormat, tokenizer, opener_seen: bool = False) -> str:
    """An llguidance grammar: opener call-json closer (after a trigger: only what follows the opener's core)."""
    import llguidance

    if opener_seen:
        tail = fmt.opener[len(fmt.opener.strip()):] if fmt.opener else ""
        opener = json.dumps(tail) if tail else ""
    else:
        opener = _lark_piece(fmt.opener, tokenizer)
    closer = _lark_piece(fmt.closer, tokenizer)
    body = json.dumps(call_schema(tools, fmt))
    lark = f"start: {opener} body {closer}\nbody: %json {body}\n"
    return llguidance.LLMatcher.grammar_from_lark(lark)


class GrammarConstraint:
    """An engine TokenConstraint backed by an llguidance LLMatcher. Mutates on advance()."""

    def __init__(self, llt, grammar: str, vocab_size: int):
        import llguidance

        self.matcher = llguidance.LLMatcher(llt, grammar, log_level=0)
        if self.matcher.is_error():
            raise ValueError(f"tool-call grammar rejected: {self.matcher.get_error()}")
        self.vocab_size = vocab_size
        self.n_llt = llt.vocab_size

    def allowed(self) -> np.ndarray:
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        mask = np.unpackbits(bits, bitorder="little")[: self.n_llt].astype(bool)  # bool [n_llt]
        if mask.size >= self.vocab_size:
            return mask[: self.vocab_size]
        return np.concatenate([mask, np.zeros(self.vocab_size - mask.size, dtype=bool)])

    def advance(self, token: int) -> None:
        self.matcher.consume_token(int(token))

    def consume(self, tokens: list[int]) -> bool:
        return self.matcher.consume_tokens([int(t) for t in tokens]) if tokens else True

    def done(self) -> bool:
        return self.matcher.is_stopped() or self.matcher.is_error()

    @property
    def error(self) -> str:
        return self.matcher.get_error()


class TriggeredConstraint:
    """tool_choice "auto": unconstrained until the reply contains the call opener, then the call grammar.

    For formats without an opener (Llama 3.1 JSON) the trigger is a reply starting with "{".
    Bytes of the triggering token past the opener are fed to the grammar (re-tokenised).
    """

    def __init__(self, make_inner: Callable[[], GrammarConstraint], fmt: CallFormat, tokenizer):
        self.make_inner = make_inner
        self.fmt = fmt
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self.inner: GrammarConstraint | None = None
        self.failed = False

    @property
    def triggered(self) -> bool:
        return self.inner is not None

    def allowed(self) -> np.ndarray | None:
        return None if self.inner is None else self.inner.allowed()

    def advance(self, token: int) -> None:
        if self.inner is not None:
            self.inner.advance(token)
            return
        if self.failed:
            return
        self.tokens.append(int(token))
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=False)
        if self.fmt.opener:
            i = text.find(self.fmt.opener.strip())
            if i < 0:
                return
            rest = text[i + len(self.fmt.opener.strip()):]
        else:
            stripped = text.lstrip()
            if not stripped:
                return
            if not stripped.startswith("{"):
                self.failed = True  # a plain text reply: never a call
                return
            rest = stripped
        self.inner = self.make_inner()
        if rest and not self.inner.consume(self.tokenizer.encode(rest, add_special_tokens=False).ids):
            self.failed = True

    def done(self) -> bool:
        if self.inner is None:
            return False
        return self.failed or self.inner.done()


class RepetitionGuard:
    """Ends a free reply once it repeats a line it already wrote, or loops on a short token pattern
    (small models loop under greedy decoding).

    Wraps another constraint (or none); the reply keeps the tokens generated so far, so the
    conversation still extends the engine's prompt + output token for token.
    """

    def __init__(self, tokenizer, inner=None, min_chars: int = 16, first_mask: np.ndarray | None = None):
        self.tokenizer = tokenizer
        self.inner = inner
        self.first_mask = first_mask  # bool [vocab]: allowed first tokens (tool_choice "none": no call opener)
        self.min_chars = min_chars
        self.tokens: list[int] = []
        self.repeated = False

    def allowed(self):
        if self.inner is None:
            return self.first_mask if not self.tokens else None
        return self.inner.allowed()

    def advance(self, token: int) -> None:
        if self.inner is not None:
            self.inner.advance(token)
        self.tokens.append(int(token))
        if getattr(self.inner, "triggered", False):
            return
        if self._looping():
            self.repeated = True
            return
        if self.tokenizer.id_to_token(int(token)) not in ("Ċ", "\n", "ĊĊ"):
            return
        lines = [ln.strip() for ln in self.tokenizer.decode(self.tokens).split("\n")]
        done = [ln for ln in lines[:-1] if len(ln) >= self.min_chars]
        self.repeated = len(done) != len(set(done))

    def _looping(self, reps: int = 4, max_period: int = 12) -> bool:
        """The last tokens are one short pattern (period <= max_period) repeated `reps` times."""
        t = self.tokens
        for p in range(1, max_period + 1):
            n = p * reps
            if len(t) >= n and t[-n:] == t[-p:] * reps:
                return True
        return False

    def done(self) -> bool:
        return self.repeated or (self.inner is not None and self.inner.done())


def no_opener_mask(tokenizer, vocab_size: int, opener: str) -> np.ndarray | None:
    """bool [vocab]: tokens that do not start the call opener (a reply under tool_choice "none")."""
    core = (opener or "{").strip()
    mask = np.ones(vocab_size, dtype=bool)
    for tid in range(min(vocab_size, tokenizer.get_vocab_size(with_added_tokens=True))):
        text = tokenizer.decode([tid], skip_special_tokens=False).lstrip()
        if text and (core.startswith(text) or text.startswith(core[:1])):
            mask[tid] = False
    return mask
