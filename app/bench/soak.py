"""`kvdeck bench soak --turns 200`: one long agent session with the default settings, as a user has it.

The engine and the agent are composed exactly as `kvdeck run` composes them (app.__main__: the
[engine] pool sizing, the built-in tools, pre-warm, the [agent] context budget); the user turns
cycle through short operator questions with tool_choice "auto" and short replies (--max-tokens).
Reported: failed turns (target 0), RSS after the first turn and at the end (target +-5%), prefix
reuse over the calls that are not trims (target >= 80%) and overall, the trims (turn, tokens
dropped and recomputed) and their TTFT against the median TTFT of the other calls, the pool's
integrity at the end. Between turns the agent trims ahead as the console does (Agent.trim_ahead:
a trim the next turn would need, computed in idle time; `--no-ahead` turns it off): such a trim's
line shows the computation and the next call's TTFT, which the user waits for.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time

from dataclasses import replace

import orjson

QUESTIONS = (
    "How hot is the board right now?",
    "Say hello in five words.",
    "What is 17 times 23?",
    "Is the fan running?",
    "Give me one tip for saving power.",
    "What time is it?",
    "Summarise the last answer in one line.",
    "Any notes on thermal throttling?",
    "Thanks. Anything else to check?",
    "How much memory is free?",
)


# ---- the run ---------------------------------------------------------------------------------
def soak(turns: int, max_tokens: int, kv_pages: int | None = None, progress=None, ahead: bool = True) -> dict:
    """Run `turns` user turns in one session; returns the figures (see the module docstring)."""
    import psutil

    from app.__main__ import _agent, _load
    from app.events import EngineCallFinished, ToolCalled, TurnFailed

    args = argparse.Namespace(model=None, weights=None, kv=None, threads=None, kv_pages=kv_pages, max_tokens=max_tokens,
                              temperature=0.0, top_k=0, top_p=1.0, seed=0, no_prewarm=False)
    proc = psutil.Process()
    t0 = time.perf_counter()
    eng = _load(args)  # exactly as `kvdeck run` loads it: [engine] settings, the pool sized by _pool
    agent = _agent(args, eng)
    agent.context.policy = replace(agent.context.policy, ahead=ahead)
    rss_load = proc.memory_info().rss
    calls: list[EngineCallFinished] = []
    failed: list[str] = []
    tools_called = 0
    rss_start = rss_load
    for i in range(turns):
        events = agent.run_turn(QUESTIONS[i % len(QUESTIONS)], "auto")
        if i + 1 < turns:
            events = itertools.chain(events, agent.trim_ahead())  # generators: trim_ahead runs after the turn
        for ev in events:
            if isinstance(ev, EngineCallFinished) and getattr(ev.stats, "kind", "generate") != "prewarm":
                calls.append(ev)
            elif isinstance(ev, TurnFailed):
                failed.append(f"turn {ev.turn}: {ev.error}")
            elif isinstance(ev, ToolCalled):
                tools_called += 1
        if i == 0:
            rss_start = proc.memory_info().rss  # after the first turn: grammar, tokenizer caches are built
        if progress and (i + 1) % 25 == 0:
            progress(f"turn {i + 1}/{turns}: {len(failed)} failed, "
                     f"{sum(c.trimmed_tokens > 0 for c in calls)} trims, prompt {calls[-1].stats.prompt_tokens} tokens")
    rss_end = proc.memory_info().rss
    try:
        eng.check_integrity()
        integrity = "ok"
    except RuntimeError as e:
        integrity = f"BROKEN: {e}"
    f = _figures(eng, agent, calls, failed, tools_called, turns, max_tokens, rss_load, rss_start, rss_end,
                 time.perf_counter() - t0)
    return f | {"integrity": integrity}


def _reuse(calls) -> float:
    prompt = sum(c.stats.prompt_tokens for c in calls)
    return sum(c.stats.cached_tokens for c in calls) / prompt if prompt else 0.0


def _figures(eng, agent, calls, failed, tools_called, turns, max_tokens, rss_load, rss_start, rss_end, wall) -> dict:
    snap = eng.snapshot()
    trims = [c for c in calls if c.trimmed_tokens > 0]
    plain = [c for c in calls if c.trimmed_tokens == 0]
    after = {}  # a trim-ahead's call -> the TTFT of the call that followed it (the one the user waited on)
    for a, b in zip(calls, calls[1:]):
        if a.stats.kind == "trim":
            after[a.call] = b.stats.ttft_s
    base_ttft = statistics.median(c.stats.ttft_s for c in plain) if plain else 0.0
    mib = 2**20
    return {
        "turns": turns, "max_tokens": max_tokens, "engine_calls": len(calls), "tool_calls": tools_called,
        "failed_turns": len(failed), "failures": failed[:10],
        "model": eng.config.model, "weights": eng.weight_format, "kv": eng.kv_format,
        "kv_pages": snap["total_pages"], "block": snap["block"],
        "context_budget": calls[-1].context_budget if calls else 0,
        "low_water": agent.context.policy.low_water,
        "prompt_tokens_max": max((c.stats.prompt_tokens for c in calls), default=0),
        "prompt_tokens_end": calls[-1].stats.prompt_tokens if calls else 0,
        "rss_load_mib": rss_load / mib, "rss_start_mib": rss_start / mib, "rss_end_mib": rss_end / mib,
        "rss_change": rss_end / rss_start - 1 if rss_start else 0.0,
        "reuse_non_trim": _reuse(plain), "reuse_all": _reuse(calls),
        "trim_ahead": agent.context.policy.ahead,
        "trims": [{"turn": c.turn, "call": c.call, "kind": c.stats.kind, "dropped_tokens": c.trimmed_tokens,
                   "recomputed_tokens": c.trim_recomputed_tokens, "prompt_tokens": c.stats.prompt_tokens,
                   "cached_tokens": c.stats.cached_tokens, "ttft_s": c.stats.ttft_s, "prefill_s": c.stats.prefill_s,
                   "next_ttft_s": after.get(c.call)} for c in trims],
        "ttft_median_non_trim_s": base_ttft,
        # what the user waits for at a trim: the trimming call's TTFT, or after a trim-ahead the next call's
        "ttft_mean_trim_s": statistics.fmean(after.get(c.call, 0.0) if c.stats.kind == "trim" else c.stats.ttft_s
                                             for c in trims) if trims else 0.0,
        "wall_s": wall,
    }


# ---- report ------------------------------------------------------------------------------------
def report(f: dict) -> list[str]:
    ok = lambda good: "PASS" if good else "FAIL"  # noqa: E731
    lines = [
        f"soak: {f['turns']} turns, {f['engine_calls']} engine calls, {f['tool_calls']} tool calls, "
        f"max_tokens {f['max_tokens']}, {f['wall_s']:.0f} s — {f['model']} {f['weights']} weights, {f['kv']} KV, "
        f"pool {f['kv_pages']} pages x {f['block']} tokens, context budget {f['context_budget']} tokens, "
        f"low water {f['low_water']:.0%}",
        f"  failed turns: {f['failed_turns']}  [{ok(f['failed_turns'] == 0)}: target 0]",
        *(f"    {x}" for x in f["failures"]),
        f"  RSS: {f['rss_load_mib']:.0f} MiB after load, {f['rss_start_mib']:.0f} MiB after turn 1, "
        f"{f['rss_end_mib']:.0f} MiB at the end ({f['rss_change']:+.1%})  [{ok(abs(f['rss_change']) <= 0.05)}: +-5%]",
        f"  reuse on the {f['engine_calls'] - len(f['trims'])} calls that are not trims: {f['reuse_non_trim']:.1%}  "
        f"[{ok(f['reuse_non_trim'] >= 0.8)}: >= 80%]; over all calls {f['reuse_all']:.1%}",
        f"  prompt: at most {f['prompt_tokens_max']} tokens, {f['prompt_tokens_end']} at the end",
        f"  trims: {len(f['trims'])} (trim ahead {'on' if f.get('trim_ahead') else 'off'}); median TTFT of the "
        f"other calls {f['ttft_median_non_trim_s'] * 1e3:.0f} ms",
    ]
    for t in f["trims"]:
        if t.get("kind") == "trim":
            nxt = t["next_ttft_s"]
            lines.append(f"    after turn {t['turn']}, ahead: dropped {t['dropped_tokens']} tokens, computed "
                         f"{t['recomputed_tokens']} kept in {t['prefill_s'] * 1e3:.0f} ms of idle time; the next call's "
                         + ("TTFT " + f"{nxt * 1e3:.0f} ms ({(nxt - f['ttft_median_non_trim_s']) * 1e3:+.0f} ms)"
                            if nxt is not None else "TTFT: no next call"))
            continue
        cost = t["ttft_s"] - f["ttft_median_non_trim_s"]
        lines.append(f"    turn {t['turn']}: dropped {t['dropped_tokens']} tokens, recomputed {t['recomputed_tokens']} "
                     f"(prompt {t['prompt_tokens']}, cached {t['cached_tokens']}), TTFT {t['ttft_s'] * 1e3:.0f} ms "
                     f"({cost * 1e3:+.0f} ms)")
    lines.append(f"  pool integrity at the end: {f['integrity']}")
    return lines


def run(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="kvdeck bench soak", description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=200, help="user turns in the one session (default 200)")
    ap.add_argument("--max-tokens", type=int, default=16, help="tokens per reply (default 16: short replies)")
    ap.add_argument("--kv-pages", type=int, default=None, help="pool size in pages (default: [engine] sizing)")
    ap.add_argument("--no-ahead", action="store_true", help="no trim ahead between turns (trims happen in the call)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    args = ap.parse_args(argv)
    if args.turns < 1 or args.max_tokens < 1:
        ap.error("--turns and --max-tokens must be >= 1")
    f = soak(args.turns, args.max_tokens, args.kv_pages, progress=lambda m: print(m, file=sys.stderr, flush=True),
             ahead=not args.no_ahead)
    if args.json:
        sys.stdout.write(orjson.dumps(f).decode() + "\n")
    else:
        print("\n".join(report(f)))
    passed = (f["failed_turns"] == 0 and abs(f["rss_change"]) <= 0.05 and f["reuse_non_trim"] >= 0.8
              and f["integrity"] == "ok")
    return 0 if passed else 1
