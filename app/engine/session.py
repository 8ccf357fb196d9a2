"""A conversation's handle on the engine (Engine.session()): its history, pins, pre-warm and
precomputed prefixes (a trim made ahead of the next call).

Contracts (see app/engine/engine.py for the engine's): every call of a session sends the whole
prompt as token ids and its ledger is the returned Generation's `stats`; `new_tokens` counts
what this session had not sent or received before. Pins last until close().
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from app.engine import _native
from app.engine.engine import Engine, Generation, Prewarm, TokenConstraint, _call_stats
from app.engine.errors import EngineError
from app.engine.types import CallStats, SamplingParams


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

    def prewarm(self, ids: Sequence[int]) -> Prewarm:
        """Compute `ids` (what is not cached yet), cache and pin it: an engine call of its own
        (stats.kind "prewarm", no generated token), so the ledger sums to all the work done.
        The ids count as sent by this session: the next call's new_tokens excludes them."""
        return self._compute(ids, "prewarm", pin=True)

    def precompute(self, ids: Sequence[int], kind: str = "trim", cancel=None) -> Prewarm:
        """Compute `ids` into the prefix cache ahead of the call that will send them (not pinned):
        an engine call of its own with stats.kind `kind` and no generated token. `cancel` (a
        native CancelFlag) stops it between layers: finish_reason "cancelled", the pages computed
        so far stay cached, stats.computed_tokens says how many were."""
        return self._compute(ids, kind, pin=False, cancel=cancel)

    def _compute(self, ids: Sequence[int], kind: str, pin: bool, cancel=None) -> Prewarm:
        self._check_open()
        eng = self.engine
        if not eng.prefix_cache:
            raise EngineError(f"{kind} needs the prefix cache (engine loaded with prefix_cache=False)")
        if len(ids) == 0:
            raise EngineError(f"{kind} needs a non-empty prefix")
        native = eng.native
        prompt = list(ids)
        dropped0 = native.dropped_events
        finish = "stop"
        t0 = time.perf_counter()
        seq = native.open_sequence(self.id)
        try:
            cached = native.begin(seq, np.asarray(prompt, np.int32))
            computed = len(prompt) - cached
            try:
                eng._forward(seq, prompt[cached:], cancel=cancel)
            except _native.CancelledError as e:
                computed = int(e.args[0]) if e.args else 0
                finish = "cancelled"
        finally:
            native.finish(seq)
        prefill_s = time.perf_counter() - t0
        n = self.pin(prompt) if pin else 0
        events = native.drain_events()
        stats = _call_stats(eng, prompt, self, cached, computed, prefill_s, prefill_s, 0.0, 0,
                            finish, events, kind, dropped0)
        self.seen_ids = prompt
        self.calls.append(stats)
        return Prewarm(stats=stats, events=events, pinned_tokens=n)

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
