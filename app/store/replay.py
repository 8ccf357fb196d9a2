"""Replay: a stored session's inputs (user turns, their times, the recorded tool results) and the
comparison of two ledgers in the shape of seed 000's table.

The command line (app/chat.py) loads an engine under the changed RunConfig, builds an Agent with
`RecordedExecutor` (tool results fed back, never re-run) and `recorded_clock` (each turn's user
message carries its recorded time), runs the recorded user turns greedily, and stores the replay
as a session whose parent_id is the source. This module needs no engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from app.store.db import Store


@dataclass(frozen=True)
class Fed:
    """A tool result as the Agent's executors return it (app.agent.executor.Executed's fields)."""

    ok: bool
    content: str
    elapsed_s: float
    outcome: str


@dataclass(frozen=True)
class RecordedTurn:
    turn: int
    user_text: str
    tool_choice: str
    now: str
    answer: str | None
    status: str


@dataclass
class RecordedExecutor:
    """Feeds back the recorded tool results of each turn, in order (outcome "replayed"). A call the
    recording does not have gets an error result (outcome "replay-missing"); a call whose name or
    arguments differ from the recording is still fed the recorded result and listed in `mismatches`."""

    results: dict[int, list[dict]]  # turn → [{name, arguments, ok, content}]
    mismatches: list[str] = field(default_factory=list)
    _used: dict[int, int] = field(default_factory=dict)

    def __call__(self, turn: int, call_id: str, name: str, arguments) -> Fed:
        i = self._used.get(turn, 0)
        self._used[turn] = i + 1
        recorded = self.results.get(turn, [])
        if i >= len(recorded):
            self.mismatches.append(f"turn {turn}: call {name} has no recorded result")
            return Fed(False, f"error: replay: the recording has no result for call {i + 1} of turn {turn}",
                            0.0, "replay-missing")
        r = recorded[i]
        if r["name"] != name or r["arguments"] != arguments:
            self.mismatches.append(f"turn {turn}: called {name}({arguments}) where the recording called "
                                   f"{r['name']}({r['arguments']})")
        return Fed(bool(r["ok"]), r["content"], 0.0, "replayed")

    def close(self) -> None:
        pass


def recorded_turns(store: Store, sid: str) -> list[RecordedTurn]:
    """The turns a replay re-runs: every turn that ran to an end (complete or failed), in order."""
    return [RecordedTurn(t["turn"], t["user_text"], t["tool_choice"], t["now"], t["answer"], t["status"])
            for t in store.rows("turns", sid) if t["status"] in ("complete", "failed")]


def recorded_executor(store: Store, sid: str) -> RecordedExecutor:
    import json

    calls = {(c["turn"], c["call_id"]): c for c in store.rows("tool_calls", sid)}
    out: dict[int, list[dict]] = {}
    for r in store.rows("tool_results", sid):
        c = calls.get((r["turn"], r["call_id"]), {})
        args = json.loads(c["arguments"]) if c.get("arguments") else None
        out.setdefault(r["turn"], []).append({"name": r["name"], "arguments": args, "ok": r["ok"],
                                              "content": r["content"]})
    return RecordedExecutor(out)


def recorded_clock(turns: list[RecordedTurn]):
    """A clock for Agent(clock=...): the n-th call returns the n-th turn's recorded time."""
    times = iter([datetime.fromisoformat(t.now) if t.now else None for t in turns])

    def clock() -> datetime:
        t = next(times, None)
        return t or datetime.now().astimezone()

    return clock


def system_prompt_of(store: Store, sid: str) -> str | None:
    for m in store.rows("messages", sid):
        if m["turn"] == 0 and m["role"] == "system":
            return m["content"]
    return None


# ---- the comparison ------------------------------------------------------------------------
def summary(calls: list[dict], answers: list[str | None]) -> dict:
    """Seed 000's figures from a ledger (engine_calls rows): TTFT per call (not the trim-ahead calls,
    which answer no one), total engine time (theirs included and shown on its own line),
    cumulative computed prefill tokens, decode tok/s, peak KV bytes."""
    dec_t = sum(c["decode_s"] or 0 for c in calls)
    dec_n = sum(c["decode_tokens"] or 0 for c in calls)
    # The KV a call needed: the pool's used pages after it (the cache keeps them), and at least the
    # pages of its own sequence (prompt + output; with the cache off they are freed when it ends).
    peak = max((max((c["kv_used_pages"] or 0) * (c["kv_block"] or 16), (c["prompt_tokens"] or 0) + (c["output_tokens"] or 0))
                * (c["kv_bytes_per_token"] or 0) for c in calls), default=0)
    return {
        "calls": len(calls),
        "ttft_s": [round(c["ttft_s"] or 0, 4) for c in calls if c["kind"] != "trim"],
        "total_s": round(sum((c["prefill_s"] or 0) + (c["decode_s"] or 0) for c in calls), 3),
        "prewarm_s": round(sum((c["prefill_s"] or 0) for c in calls if c["kind"] == "prewarm"), 3),
        "trim_ahead_s": round(sum((c["prefill_s"] or 0) for c in calls if c["kind"] == "trim"), 3),
        "prefill_s": round(sum(c["prefill_s"] or 0 for c in calls), 3),
        "decode_s": round(dec_t, 3),
        "decode_tokens": dec_n,
        "prompt_tokens": sum(c["prompt_tokens"] or 0 for c in calls),
        "computed_tokens": sum(c["computed_tokens"] or 0 for c in calls),
        "cached_tokens": sum(c["cached_tokens"] or 0 for c in calls),
        "decode_tok_s": round(dec_n / dec_t, 2) if dec_t > 0 else 0.0,
        "peak_kv_bytes": int(peak),
        "answers": answers,
    }


def compare(a: dict, b: dict) -> dict:
    """Both summaries plus the ratios (a / b) and whether the answers are identical."""
    return {"source": a, "replay": b,
            "speedup_total": round(a["total_s"] / b["total_s"], 2) if b["total_s"] else None,
            "computed_ratio": round(a["computed_tokens"] / b["computed_tokens"], 3) if b["computed_tokens"] else None,
            "identical_answers": a["answers"] == b["answers"]}


def side_by_side(a_calls: list[dict], b_calls: list[dict], a_label: str, b_label: str) -> list[str]:
    head = f"{'turn':>4} {'call':>4} {'kind':<8} | {'prompt':>6} {'cached':>6} {'comp':>6} {'ttft_s':>7} " \
           f"| {'prompt':>6} {'cached':>6} {'comp':>6} {'ttft_s':>7}"
    lines = [f"A: {a_label}", f"B: {b_label}", f"{'':<19}| {'A':<29}| B", head]
    by_a = {(c["turn"], c["call"]): c for c in a_calls}
    by_b = {(c["turn"], c["call"]): c for c in b_calls}
    for key in sorted(set(by_a) | set(by_b)):  # calls are numbered alike: the pre-warm is call 0
        a, b = by_a.get(key), by_b.get(key)
        ref = a or b

        def cols(c):
            if c is None:
                return f"{'-':>6} {'-':>6} {'-':>6} {'-':>7}"
            return f"{c['prompt_tokens']:>6} {c['cached_tokens']:>6} {c['computed_tokens']:>6} {c['ttft_s']:>7.3f}"

        lines.append(f"{ref['turn']:>4} {ref['call']:>4} {ref['kind']:<8} | {cols(a)} | {cols(b)}")
    return lines


def summary_table(cmp: dict, a_label: str, b_label: str) -> list[str]:
    a, b = cmp["source"], cmp["replay"]

    def kb(n):
        return f"{n / 2**20:.1f} MiB"

    rows = [
        ("TTFT per call (s)", " ".join(f"{t:.2f}" for t in a["ttft_s"]), " ".join(f"{t:.2f}" for t in b["ttft_s"])),
        ("total engine time (s)", f"{a['total_s']:.2f}", f"{b['total_s']:.2f}"),
        ("  of which pre-warm (s)", f"{a['prewarm_s']:.2f}", f"{b['prewarm_s']:.2f}"),
        ("  of which trim-ahead (s)", f"{a.get('trim_ahead_s', 0):.2f}", f"{b.get('trim_ahead_s', 0):.2f}"),
        ("  prefill / decode (s)", f"{a['prefill_s']:.2f} / {a['decode_s']:.2f}", f"{b['prefill_s']:.2f} / {b['decode_s']:.2f}"),
        ("decode tokens", str(a["decode_tokens"]), str(b["decode_tokens"])),
        ("computed prefill tokens", str(a["computed_tokens"]), str(b["computed_tokens"])),
        ("cached prompt tokens", str(a["cached_tokens"]), str(b["cached_tokens"])),
        ("decode tok/s", f"{a['decode_tok_s']:.1f}", f"{b['decode_tok_s']:.1f}"),
        ("peak KV", kb(a["peak_kv_bytes"]), kb(b["peak_kv_bytes"])),
    ]
    w = max(len(r[1]) for r in rows) + 2
    out = [f"{'':<26}{a_label:<{w}}{b_label}"] + [f"{n:<26}{x:<{w}}{y}" for n, x, y in rows]
    if a["total_s"] and b["total_s"]:
        out.append(f"{'replay time / source time':<26}{b['total_s'] / a['total_s']:.2f}x")
    same = [x == y for x, y in zip(a["answers"], b["answers"])]
    out.append(f"{'identical answers':<26}{'yes' if cmp['identical_answers'] else 'no'} "
               f"({sum(same)} of {max(len(a['answers']), len(b['answers']))} turns)")
    return out
