"""The Python handle over the native engine: cold forwards and streamed generation.

Contracts
- One Engine per loaded model; not thread-safe (one caller at a time). Native calls
  release the GIL, so a UI thread keeps running while a worker thread generates.
- generate() opens a sequence, streams token ids, and closes the sequence when the
  stream ends or is closed early; its ledger is `Generation.stats` after the stream ends.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Protocol
from pathlib import Path

import numpy as np

from app.engine import _native
from app.engine.errors import EngineError, KvPoolFull
from app.engine.types import CallStats, ModelConfig, SamplingParams


class Engine:
    def __init__(self, native: _native.Engine, config: ModelConfig, tokenizer, folder: Path, prefix_cache: bool = True):
        self.native = native
        self.config = config
        self.tokenizer = tokenizer
        self.folder = folder
        self.prefix_cache = prefix_cache
        self._next_session = 0
        # Events drained but not yet handed to a call (e.g. from a session's prewarm).
        self._pending_events: list[dict] = []

    # ---- facts ----------------------------------------------------------------------
    @property
    def weight_format(self) -> str:
        return self.config.weight_format

    @property
    def kv_format(self) -> str:
        return self.native.kv_format

    @property
    def backend(self) -> str:
        return self.native.backend

    # ---- cold forward ---------------------------------------------------------------
    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """f32 [len(ids), vocab]: every position's logits from a fresh sequence."""
        seq = self.native.open_sequence()
        try:
            return self._forward(seq, ids, all_logits=True)
        finally:
            self.native.close_sequence(seq)

    def _forward(self, seq: int, ids: Sequence[int], all_logits: bool = False) -> np.ndarray:
        arr = np.asarray(ids, dtype=np.int32)
        if arr.ndim != 1 or arr.size == 0:
            raise EngineError("forward needs a non-empty 1-D list of token ids")
        try:
            return self.native.forward(seq, arr, all_logits)
        except _native.KvPoolFullError as e:
            raise KvPoolFull(str(e)) from None
        except ValueError as e:
            raise EngineError(str(e)) from None

    # ---- generation -----------------------------------------------------------------
    def session(self, name: str = "default") -> Session:
        """A conversation's handle on the engine (see Session)."""
        self._next_session += 1
        return Session(self, name, self._next_session)

    # ---- the prefix cache -----------------------------------------------------------
    def snapshot(self) -> dict:
        """Pool occupancy: total/used/free/pinned/evictable/locked/cached pages, tree nodes,
        block, bytes_per_token."""
        return self.native.snapshot()

    def tree(self) -> list[dict]:
        """The radix tree's nodes (id, parent, start, tokens, pages, lock_ref, pin_ref,
        last_access, owner) for the cache inspector."""
        return self.native.tree_dump()

    def clear_cache(self) -> int:
        """Drop every unpinned, unlocked cached page; returns the pages dropped."""
        return self.native.clear_cache()

    def check_integrity(self) -> None:
        """Raise RuntimeError naming the first broken invariant of pool, tree, sequences."""
        self.native.check_integrity()

    def generate(
        self,
        prompt: Sequence[int],
        sampling: SamplingParams = SamplingParams(),
        max_tokens: int = 256,
        stop_ids: Sequence[int] | None = None,
        constraint: TokenConstraint | None = None,
        session: Session | None = None,
    ) -> Generation:
        """Stream a reply to `prompt` (token ids). Without a session the call is anonymous:
        it still reads and feeds the prefix cache."""
        if max_tokens < 1:
            raise EngineError(f"max_tokens must be >= 1, got {max_tokens}")
        if len(prompt) == 0:
            raise EngineError("the prompt has no tokens")
        limit = self.config.max_position_embeddings
        if len(prompt) + max_tokens > limit:
            raise EngineError(
                f"prompt of {len(prompt)} tokens + max_tokens {max_tokens} exceeds the model's context of {limit} tokens"
            )
        stops = set(self.config.stop_token_ids if stop_ids is None else stop_ids)
        return Generation(self, list(prompt), sampling, max_tokens, stops, constraint, session)


class TokenConstraint(Protocol):
    """Constrained decoding (e.g. a grammar): a mask before each token, told each choice."""

    def allowed(self) -> np.ndarray | None:
        """bool [vocab] of tokens allowed next, or None for no restriction."""

    def advance(self, token: int) -> None:
        """The token that was chosen."""

    def done(self) -> bool:
        """True when the constrained text is complete: generation ends here."""


class Generation:
    """An iterator of generated token ids; `stats` holds the ledger once it has ended.

    The stop token, when hit, ends the stream and is not yielded (it is in `output_ids`).
    `events` holds the cache events of this call (hit, insert, evict, pin).
    """

    def __init__(
        self,
        engine: Engine,
        prompt: list[int],
        sampling: SamplingParams,
        max_tokens: int,
        stops: set[int],
        constraint: TokenConstraint | None = None,
        session: Session | None = None,
    ):
        self.engine = engine
        self.prompt = prompt
        self.sampling = sampling
        self.max_tokens = max_tokens
        self.stops = stops
        self.constraint = constraint
        self.session = session
        self.tokens: list[int] = []
        self.output_ids: list[int] = []  # tokens + the stop token when one ended the stream
        self.stats: CallStats | None = None
        self.events: list[dict] = []
        self._it = self._run()

    def __iter__(self) -> Iterator[int]:
        return self

    def __next__(self) -> int:
        return next(self._it)

    def close(self) -> None:
        self._it.close()

    def text(self) -> str:
        return self.engine.tokenizer.decode(self.tokens, skip_special_tokens=True)

    def _choose(self, sampler, logits: np.ndarray) -> int:
        """Sample the next token, under the constraint's mask when there is one.

        Returns -1 when the constraint has finished (the stream ends as at a stop token).
        """
        sp = self.sampling
        c = self.constraint
        if c is None:
            return sampler.sample(logits, sp.temperature, sp.top_k, sp.top_p)
        if c.done():
            return -1
        mask = c.allowed()
        if mask is not None:
            logits = np.where(mask, logits, np.float32(-np.inf)).astype(np.float32)
        tok = sampler.sample(logits, sp.temperature, sp.top_k, sp.top_p)
        c.advance(tok)
        return tok

    def _run(self) -> Iterator[int]:
        eng, sp = self.engine, self.sampling
        native = eng.native
        sampler = _native.Sampler(sp.seed)
        sid = self.session.id if self.session else 0
        t0 = time.perf_counter()
        finish = "length"
        decode_s = prefill_s = ttft_s = 0.0
        decode_tokens = cached = 0
        seq = native.open_sequence(sid)
        try:
            cached = native.begin(seq, np.asarray(self.prompt, np.int32)) if eng.prefix_cache else 0
            logits = eng._forward(seq, self.prompt[cached:])
            prefill_s = time.perf_counter() - t0
            tok = self._choose(sampler, logits)
            ttft_s = time.perf_counter() - t0
            while True:
                if tok in self.stops or tok < 0:
                    finish = "stop"
                    if tok >= 0:
                        self.output_ids.append(tok)
                    break
                self.tokens.append(tok)
                self.output_ids.append(tok)
                yield tok
                if len(self.tokens) >= self.max_tokens:
                    break
                t = time.perf_counter()
                logits = eng._forward(seq, [tok])
                tok = self._choose(sampler, logits)
                decode_s += time.perf_counter() - t
                decode_tokens += 1
        except GeneratorExit:
            finish = "cancelled"  # the consumer closed the stream early
            raise
        finally:
            if eng.prefix_cache:
                native.finish(seq)
            else:
                native.close_sequence(seq)
            self.events = eng._pending_events + native.drain_events()
            eng._pending_events = []
            if ttft_s > 0:  # the prompt was computed: the call has a ledger, even if cut short
                self.stats = self._ledger(cached, prefill_s, ttft_s, decode_s, decode_tokens, finish)
                if self.session is not None:
                    self.session._called(self)

    def _ledger(self, cached, prefill_s, ttft_s, decode_s, decode_tokens, finish) -> CallStats:
        eng = self.engine
        n = len(self.prompt)
        seen = self.session.seen_ids if self.session else []
        common = 0
        for a, b in zip(self.prompt, seen):
            if a != b:
                break
            common += 1
        new = n - common
        computed = n - cached
        snap = eng.native.snapshot()
        return CallStats(
            prompt_tokens=n,
            cached_tokens=cached,
            computed_tokens=computed,
            new_tokens=new,
            waste_tokens=max(0, computed - new),
            reuse=cached / n,
            ttft_s=ttft_s,
            prefill_s=prefill_s,
            decode_s=decode_s,
            decode_tokens=decode_tokens,
            decode_tok_s=decode_tokens / decode_s if decode_s > 0 else 0.0,
            finish_reason=finish,
            weight_format=eng.weight_format,
            kv_format=eng.kv_format,
            backend=eng.backend,
            kv_used_pages=snap["used_pages"],
            kv_pinned_pages=snap["pinned_pages"],
            kv_free_pages=snap["free_pages"],
            evicted_pages=sum(e["pages"] for e in self.events if e["kind"] == "evict"),
        )


class Session:
    """A client of the engine with a history: the agent's one conversation.

    Every call sends the whole prompt (system + tools + history + new message) as token
    ids; the engine serves what it can from its prefix cache and computes the rest. The
    ledger of each call is on the returned Generation's `stats` once it has ended:
    `new_tokens` counts the prompt's tokens beyond what this session sent and received
    before (the previous call's prompt + output).

    A session may pin prefixes (never evicted while pinned) and pre-warm a static prefix
    (compute it, cache it and pin it before the first call). close() releases its pins.
    """

    def __init__(self, engine: Engine, name: str, sid: int):
        self.engine = engine
        self.name = name
        self.id = sid
        self.closed = False
        self.seen_ids: list[int] = []  # previous call's prompt + output
        self.calls: list[CallStats] = []

    def generate(
        self,
        prompt: Sequence[int],
        sampling: SamplingParams = SamplingParams(),
        max_tokens: int = 256,
        stop_ids: Sequence[int] | None = None,
        constraint: TokenConstraint | None = None,
    ) -> Generation:
        self._check_open()
        return self.engine.generate(prompt, sampling, max_tokens, stop_ids, constraint, session=self)

    def _called(self, gen: Generation) -> None:
        self.seen_ids = gen.prompt + gen.output_ids
        self.calls.append(gen.stats)

    def pin(self, ids: Sequence[int]) -> int:
        """Pin the cached whole pages of `ids` until close(); returns the tokens pinned."""
        self._check_open()
        _, tokens = self.engine.native.pin(self.id, np.asarray(ids, np.int32))
        return tokens

    def prewarm(self, ids: Sequence[int]) -> int:
        """Compute `ids` (what is not cached yet), cache and pin it. Returns tokens pinned."""
        self._check_open()
        eng = self.engine
        if not eng.prefix_cache:
            raise EngineError("prewarm needs the prefix cache (engine loaded with prefix_cache=False)")
        native = eng.native
        seq = native.open_sequence(self.id)
        try:
            arr = np.asarray(ids, np.int32)
            cached = native.begin(seq, arr)
            eng._forward(seq, list(ids)[cached:])
        finally:
            native.finish(seq)
        n = self.pin(ids)
        eng._pending_events += native.drain_events()
        return n

    def close(self) -> None:
        """Release this session's pins. Idempotent."""
        if not self.closed:
            self.engine.native.release_session(self.id)
            self.closed = True

    def _check_open(self) -> None:
        if self.closed:
            raise EngineError(f"session {self.name!r} is closed")

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
