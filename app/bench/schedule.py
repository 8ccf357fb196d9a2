"""The measuring core of `kvdeck bench cpu`: what to measure, our engine's runner, the schedule.

A runner (KvdeckRunner here, peer.LlamaRunner for llama.cpp) has a `name` and two timing calls
on a fresh sequence: `prefill(n) -> s` and `prefill_decode(ctx, n) -> (s_prefill, s_decode)`.
`measure` interleaves runners (A B A B) and returns every repetition; `fastest` picks the figure.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import numpy as np

MODEL = "smollm2-135m"
KV = "f16"                      # our KV pages in f16, as llama.cpp's default cache type


# ============================================================================
# What one run measures
# ============================================================================
@dataclass(frozen=True)
class Plan:
    """What one run measures: prefill lengths, decode contexts, decoded tokens per decode run."""
    prefill: tuple[int, ...]
    decode_ctx: tuple[int, ...]
    decode_tokens: int

    def figures(self) -> list[str]:
        return [f"prefill_{n}" for n in self.prefill] + [f"decode_{c}" for c in self.decode_ctx]

    def tokens(self, figure: str) -> int:
        kind, n = figure.split("_")
        return int(n) if kind == "prefill" else self.decode_tokens

    @property
    def n_ctx(self) -> int:
        return max(self.prefill + self.decode_ctx) + self.decode_tokens

    @property
    def n_batch(self) -> int:
        return max(self.prefill + self.decode_ctx)


FULL = Plan(prefill=(512, 2048), decode_ctx=(32, 2048), decode_tokens=128)
QUICK = Plan(prefill=(128,), decode_ctx=(32,), decode_tokens=16)
LOAD = Plan(prefill=(), decode_ctx=(32,), decode_tokens=128)
LOAD_QUICK = Plan(prefill=(), decode_ctx=(32,), decode_tokens=16)


def progress(text: str) -> None:
    """A progress line on stderr (stdout carries only the result)."""
    print(f"[bench cpu {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def label(figure: str) -> str:
    kind, n = figure.split("_")
    return f"prefill {n}" if kind == "prefill" else f"decode@{n}"


# ============================================================================
# kvdeck runner and the interleaved schedule
# ============================================================================
class KvdeckRunner:
    """One kvdeck engine (one weight format) with the same timing calls as peer.LlamaRunner.

    Calls forward on fresh sequences directly (no prefix-cache lookup: every prefill computes).
    """

    def __init__(self, fmt: str, ids: np.ndarray, threads: int, n_ctx: int):
        from app.engine import _native, load_engine

        self.name, self.fmt, self.ids = f"kvdeck {fmt}", fmt, ids
        weights, _, act = fmt.partition("@")  # "gguf@a8": the gguf folder with 8-bit activations
        self.engine = load_engine(MODEL, weights=weights, kv=KV, threads=threads, max_context=n_ctx,
                                  activations=act or "auto")
        self.nat = self.engine.native
        self.isa = _native.kernels.kernel_isa()

    def prefill(self, n: int) -> float:
        return self.prefill_decode(n, 0)[0]

    def prefill_decode(self, ctx: int, n_decode: int) -> tuple[float, float]:
        seq = self.nat.open_sequence()
        try:
            t0 = time.perf_counter()
            self.nat.forward(seq, self.ids[:ctx], False)
            t1 = time.perf_counter()
            for i in range(ctx, ctx + n_decode):
                self.nat.forward(seq, self.ids[i:i + 1], False)
            return t1 - t0, time.perf_counter() - t1
        finally:
            self.nat.close_sequence(seq)

    def close(self) -> None:
        self.engine = self.nat = None


def measure(runners: list, plan: Plan, reps: int, budget_s: float = float("inf"),
            warmup: bool = True) -> dict[str, dict[str, list[float]]]:
    """tok/s samples per runner name per figure (one per repetition), the runners interleaved.

    Each repetition runs every step on every runner before the next step (the runner order
    rotated by one each repetition). A decode step's timed prefill is also the prefill figure
    of that length when the plan has one. The first repetition always runs whole; a later one
    starts only while the time spent so far is under budget_s (so fewer than reps may run).
    """
    steps = [("prefill", n) for n in plan.prefill if n not in plan.decode_ctx]
    steps += [("decode", c) for c in plan.decode_ctx]
    secs = {r.name: {f: [] for f in plan.figures()} for r in runners}
    if warmup:
        for r in runners:
            r.prefill_decode(min(plan.decode_ctx), min(8, plan.decode_tokens))
    t_start = time.monotonic()
    for rep in range(reps):
        spent = time.monotonic() - t_start
        if rep and spent > budget_s:
            progress(f"time budget {budget_s:.0f} s spent ({spent:.0f} s): {rep} of {reps} repetitions")
            break
        progress(f"repetition {rep + 1}/{reps} over {len(runners)} engine configurations")
        k = rep % len(runners)
        for kind, n in steps:
            for r in runners[k:] + runners[:k]:
                if kind == "prefill":
                    secs[r.name][f"prefill_{n}"].append(r.prefill(n))
                    continue
                t_pre, t_dec = r.prefill_decode(n, plan.decode_tokens)
                secs[r.name][f"decode_{n}"].append(t_dec)
                if n in plan.prefill:
                    secs[r.name][f"prefill_{n}"].append(t_pre)
    return {name: {f: [plan.tokens(f) / t for t in v] for f, v in figs.items()}
            for name, figs in secs.items()}


def fastest(samples: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    """The figure of each runner: its fastest repetition."""
    return {name: {f: max(v) for f, v in figs.items()} for name, figs in samples.items()}


def best_of(rates: dict[str, dict[str, float]], names: dict[str, str], figures: list[str]) -> dict:
    """{figure: {"tok_s", "setting"}}: the best of several runners (names: runner -> setting)."""
    out = {}
    for f in figures:
        win = max(names, key=lambda n: rates[n][f])
        out[f] = {"tok_s": rates[win][f], "setting": names[win]}
    return out
