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
    def __init__(self, native: _native.Engine, config: ModelConfig, tokenizer, folder: Path):
        self.native = native
        self.config = config
        self.tokenizer = tokenizer
        self.folder = folder

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
        return Session(self, name)

    def generate(
        self,
        prompt: Sequence[int],
        sampling: SamplingParams = SamplingParams(),
        max_tokens: int = 256,
        stop_ids: Sequence[int] | None = None,
        constraint: TokenConstraint | None = None,
    ) -> Generation:
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
        return Generation(self, list(prompt), sampling, max_tokens, stops, constraint)


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

    The stop token, when hit, ends the stream and is not yielded.
    """

    def __init__(
        self,
        engine: Engine,
        prompt: list[int],
        sampling: SamplingParams,
        max_tokens: int,
        stops: set[int],
        constraint: TokenConstraint | None = None,
    ):
        self.engine = engine
        self.prompt = prompt
        self.sampling = sampling
        self.max_tokens = max_tokens
        self.stops = stops
        self.constraint = constraint
        self.tokens: list[int] = []
        self.stats: CallStats | None = None
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
        seq = native.open_sequence()
        t0 = time.perf_counter()
        finish = "length"
        decode_s = 0.0
        decode_tokens = 0
        try:
            logits = eng._forward(seq, self.prompt)
            tok = self._choose(sampler, logits)
            t1 = time.perf_counter()
            prefill_s = ttft_s = t1 - t0
            while True:
                if tok in self.stops or tok < 0:
                    finish = "stop"
                    break
                self.tokens.append(tok)
                yield tok
                if len(self.tokens) >= self.max_tokens:
                    break
                t = time.perf_counter()
                logits = eng._forward(seq, [tok])
                tok = self._choose(sampler, logits)
                decode_s += time.perf_counter() - t
                decode_tokens += 1
        finally:
            used, free = native.kv_used_pages, native.kv_free_pages
            native.close_sequence(seq)
        n = len(self.prompt)
        self.stats = CallStats(
            prompt_tokens=n,
            cached_tokens=0,
            computed_tokens=n,
            ttft_s=ttft_s,
            prefill_s=prefill_s,
            decode_s=decode_s,
            decode_tokens=decode_tokens,
            decode_tok_s=decode_tokens / decode_s if decode_s > 0 else 0.0,
            finish_reason=finish,
            weight_format=eng.weight_format,
            kv_format=eng.kv_format,
            backend=eng.backend,
            kv_used_pages=used,
            kv_free_pages=free,
        )


class Session:
    """A client of the engine with a history: the agent's one conversation.

    Every call sends the whole prompt (system + tools + history + new message) as token
    ids; the engine serves what it can from its prefix cache and computes the rest. The
    ledger of each call is on the returned Generation's `stats` once it has ended.
    """

    def __init__(self, engine: Engine, name: str):
        self.engine = engine
        self.name = name
        self.closed = False

    def generate(
        self,
        prompt: Sequence[int],
        sampling: SamplingParams = SamplingParams(),
        max_tokens: int = 256,
        stop_ids: Sequence[int] | None = None,
        constraint: TokenConstraint | None = None,
    ) -> Generation:
        if self.closed:
            raise EngineError(f"session {self.name!r} is closed")
        return self.engine.generate(prompt, sampling, max_tokens, stop_ids, constraint)

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
