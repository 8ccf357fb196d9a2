"""The Python handle over the native engine: cold forwards and streamed generation.

Contracts
- One Engine per loaded model. Every method is safe from any thread: the native engine
  serialises its state behind one lock and releases the GIL while it waits or computes, so a
  UI thread keeps running while a worker generates. snapshot() and tree() are cheap copies
  that never wait for a running prefill.
- generate() opens a sequence, streams token ids, and closes the sequence when the
  stream ends or is closed early; its ledger is `Generation.stats` after the stream ends.
- Generation.cancel() (any thread) stops the call between layers of its prefill or between
  decode steps: the stream ends, `stats.finish_reason` is "cancelled", the pages computed so
  far stay in the prefix cache and the session goes on. A Generation is consumed by one thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol
from pathlib import Path

import numpy as np

from app.engine import _native
from app.engine.errors import EngineError, KvPoolFull
from app.engine.types import CallStats, ModelConfig, SamplingParams

if TYPE_CHECKING:
    from app.engine.session import Session


class Engine:
    def __init__(self, native: _native.Engine, config: ModelConfig, tokenizer, folder: Path, prefix_cache: bool = True):
        self.native = native
        self.config = config
        self.tokenizer = tokenizer
        self.folder = folder
        self.prefix_cache = prefix_cache
        self._next_session = 0
        self._ids_lock = threading.Lock()

    # ---- facts ----------------------------------------------------------------------
    @property
    def weight_format(self) -> str:
        return self.config.weight_format

    @property
    def activations(self) -> str:
        """The integer matmuls' activations as loaded: a8 or a16 (auto already resolved)."""
        return self.native.activations

    @property
    def kv_format(self) -> str:
        return self.native.kv_format

    @property
    def backend(self) -> str:
        return self.native.backend

    @property
    def threads(self) -> int:
        return self.native.threads

    @property
    def dropped_events(self) -> int:
        """Cache events lost because the native ring was full (not drained in time)."""
        return self.native.dropped_events

    # ---- cold forward ---------------------------------------------------------------
    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """f32 [len(ids), vocab]: every position's logits from a fresh sequence."""
        seq = self.native.open_sequence()
        try:
            return self._forward(seq, ids, all_logits=True)
        finally:
            self.native.close_sequence(seq)

    def _forward(self, seq: int, ids: Sequence[int], all_logits: bool = False, cancel=None) -> np.ndarray:
        arr = np.asarray(ids, dtype=np.int32)
        if arr.ndim != 1 or arr.size == 0:
            raise EngineError("forward needs a non-empty 1-D list of token ids")
        try:
            return self.native.forward(seq, arr, all_logits, cancel)
        except _native.KvPoolFullError as e:
            raise KvPoolFull(str(e)) from None
        except ValueError as e:
            raise EngineError(str(e)) from None

    def _forward_sample(self, seq: int, ids: Sequence[int], sampler, sp: SamplingParams,
                        mask: np.ndarray | None, cancel=None) -> int:
        """_forward, then the next token chosen on the backend (Backend::sample: the CPU
        Sampler's choice from the logits with the tokens where mask is False at -inf); one id
        comes back instead of the vocabulary's logits."""
        arr = np.asarray(ids, dtype=np.int32)
        if arr.ndim != 1 or arr.size == 0:
            raise EngineError("forward needs a non-empty 1-D list of token ids")
        try:
            return self.native.forward_sample(seq, arr, sampler, sp.temperature, sp.top_k, sp.top_p, mask, cancel)
        except _native.KvPoolFullError as e:
            raise KvPoolFull(str(e)) from None
        except ValueError as e:
            raise EngineError(str(e)) from None

    # ---- generation -----------------------------------------------------------------
    def session(self, name: str = "default") -> Session:
        """A conversation's handle on the engine (see Session)."""
        with self._ids_lock:
            self._next_session += 1
            sid = self._next_session
        from app.engine.session import Session  # session.py builds on this module

        return Session(self, name, sid)

    # ---- the prefix cache -----------------------------------------------------------
    def snapshot(self) -> dict:
        """Pool occupancy: total/used/free/pinned/evictable/locked/cached pages, tree nodes,
        block, bytes_per_token."""
        return self.native.snapshot()

    def tree(self) -> list[dict]:
        """The radix tree's nodes (id, parent, start, tokens, pages, lock_ref, pin_ref,
        last_access, owner) for the cache inspector."""
        return self.native.tree_dump()

    def progress(self) -> float | None:
        """Fraction [0, 1] of the prefill in flight (chunks and layers done), or None when no
        prefill is running. Never waits for it."""
        p = self.native.progress()
        if p is None or p["total"] <= 0:
            return None
        return (p["done"] + p["chunk"] * p["layer"] / max(1, p["layers"])) / p["total"]

    def prefill_progress(self) -> dict | None:
        """The raw record: {seq, total, done, chunk, layer, layers} or None."""
        return self.native.progress()

    def drain_events(self) -> list[dict]:
        """Cache events not yet handed to a call (e.g. evictions by clear_cache)."""
        return self.native.drain_events()

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


@dataclass(frozen=True)
class Prewarm:
    """The result of Session.prewarm: its ledger, its cache events and the tokens pinned."""

    stats: CallStats
    events: list[dict] = field(default_factory=list)
    pinned_tokens: int = 0


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
        self._cancel = _native.CancelFlag()
        self._it = self._run()

    def __iter__(self) -> Iterator[int]:
        return self

    def __next__(self) -> int:
        return next(self._it)

    def close(self) -> None:
        """End the stream from the consuming thread (finish_reason "cancelled" if unfinished)."""
        self._it.close()

    def cancel(self) -> None:
        """Stop the call from any thread: its running prefill stops between layers and
        decoding stops before the next step; the stream then ends."""
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set

    def text(self) -> str:
        return self.engine.tokenizer.decode(self.tokens, skip_special_tokens=True)

    def _step(self, sampler, seq: int, ids: Sequence[int]) -> int:
        """Compute ids and choose the next token on the engine's backend, under the
        constraint's mask when there is one (the mask goes to the backend with the step; only
        the id comes back: on a GPU the logits stay there).

        Returns -1 when the constraint has finished (the stream ends as at a stop token); the
        ids are computed either way, so the sequence holds every token it was given.
        """
        sp, c = self.sampling, self.constraint
        done = c is not None and c.done()
        mask = None if c is None or done else c.allowed()
        if done:  # the token is not used: no draw from the sampler
            sp = SamplingParams()
        tok = self.engine._forward_sample(seq, ids, sampler, sp, mask, cancel=self._cancel)
        if done:
            return -1
        if c is not None:
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
        computed = 0  # prompt tokens computed (all of the tail, or the chunks done before a cancel)
        self._dropped0 = native.dropped_events
        seq = native.open_sequence(sid)
        try:
            cached = native.begin(seq, np.asarray(self.prompt, np.int32)) if eng.prefix_cache else 0
            try:
                tok = self._step(sampler, seq, self.prompt[cached:])
            except _native.CancelledError as e:
                computed = int(e.args[0]) if e.args else 0
                prefill_s = time.perf_counter() - t0
                finish = "cancelled"
                return
            computed = len(self.prompt) - cached
            prefill_s = ttft_s = time.perf_counter() - t0  # the prefill's last step chose the token
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
                if self._cancel.is_set:
                    finish = "cancelled"
                    break
                t = time.perf_counter()
                try:
                    tok = self._step(sampler, seq, [tok])
                except _native.CancelledError:
                    finish = "cancelled"
                    break
                except KvPoolFull:
                    finish = "pool_full"  # the reply so far stands; the pool cannot hold another token
                    break
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
            self.events = native.drain_events()
            if ttft_s > 0 or finish == "cancelled":  # the call ran: it has a ledger, even if cut short
                self.stats = self._ledger(cached, computed, prefill_s, ttft_s, decode_s, decode_tokens, finish)
                if self.session is not None and ttft_s > 0:
                    self.session._called(self)

    def _ledger(self, cached, computed, prefill_s, ttft_s, decode_s, decode_tokens, finish) -> CallStats:
        return _call_stats(self.engine, self.prompt, self.session, cached, computed, prefill_s, ttft_s,
                           decode_s, decode_tokens, finish, self.events, "generate", self._dropped0)


def _call_stats(eng: Engine, prompt: list[int], session: Session | None, cached: int, computed: int,
                prefill_s: float, ttft_s: float, decode_s: float, decode_tokens: int, finish: str,
                events: list[dict], kind: str, dropped0: int = 0) -> CallStats:
    """The ledger of one engine call (DESIGN.md § Per-turn ledger). dropped0: the native
    ring's dropped-event count when the call began."""
    n = len(prompt)
    seen = session.seen_ids if session else []
    common = 0
    for a, b in zip(prompt, seen):
        if a != b:
            break
        common += 1
    new = n - common
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
        evicted_pages=sum(e["pages"] for e in events if e["kind"] == "evict"),
        threads=eng.threads,
        events_dropped=eng.dropped_events - dropped0,
        kind=kind,
    )
