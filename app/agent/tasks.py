"""Scripted agent tasks (assets/tasks/*.toml | *.json) and the prefix-reuse gate (`kvdeck check-prefix`).

A task file:

    name = "seed-000"
    extends = "other.toml"      # optional: take steps (and options) from another task file
    system_timestamp = false    # true: the classic bug, a timestamp in the system prompt
    follow_up = "none"          # tool_choice after a tool result (default "auto")
    [[steps]]
    user = "Look up my notes on Jetson thermal throttling."
    tool_choice = "search_notes"   # auto | required | none | a tool's name

The gate: cumulative reuse = Σ cached_tokens / Σ prompt_tokens over every engine call of the
task as the engine reports it, the pre-warm of the static prefix included (an engine call of
its own, kind "prewarm": its computed tokens are work the task paid for). The steady-state
figure leaves the pre-warm out (what each turn's calls see once the prefix is warm); both are
printed, labelled. The detector's token comparison gives the "reusable" figure (what a prefix
cache could serve).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from app.agent.loop import Agent
from app.events import EngineCallFinished, Event, PrefixBreak, PromptLinted, TurnFailed

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclass(frozen=True)
class Step:
    user: str
    tool_choice: str = "auto"


@dataclass(frozen=True)
class Task:
    name: str
    steps: tuple[Step, ...]
    system_timestamp: bool = False
    follow_up: str = "auto"
    source: str = ""


def load_task(path: str | Path) -> Task:
    p = Path(path)
    try:
        raw = json.loads(p.read_text()) if p.suffix == ".json" else tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise ValueError(f"{p}: task file not found") from None
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{p}: not a valid task file ({e})") from None
    base = load_task(p.parent / raw["extends"]) if raw.get("extends") else None
    steps = tuple(Step(str(s["user"]), str(s.get("tool_choice", "auto"))) for s in raw.get("steps", []))
    if not steps and base:
        steps = base.steps
    if not steps:
        raise ValueError(f"{p}: a task needs [[steps]] with a user message each")
    ts = raw.get("system_timestamp", base.system_timestamp if base else False)
    follow = raw.get("follow_up", base.follow_up if base else "auto")
    return Task(str(raw.get("name", p.stem)), steps, bool(ts), str(follow), str(p))


def is_prewarm(call: EngineCallFinished) -> bool:
    return getattr(call.stats, "kind", "generate") == "prewarm"


@dataclass
class TaskReport:
    calls: list[EngineCallFinished] = field(default_factory=list)  # every engine call, the pre-warm included
    breaks: list[PrefixBreak] = field(default_factory=list)
    lint: tuple[str, ...] = ()
    failures: list[str] = field(default_factory=list)

    @property
    def turn_calls(self) -> list[EngineCallFinished]:
        """The calls the turns made (steady state: the pre-warm left out)."""
        return [c for c in self.calls if not is_prewarm(c)]

    @property
    def prompt_tokens(self) -> int:
        return sum(c.stats.prompt_tokens for c in self.calls)

    @property
    def cached_tokens(self) -> int:
        return sum(c.stats.cached_tokens for c in self.calls)

    @property
    def reuse(self) -> float:
        """Σ cached / Σ prompt over every engine call, the pre-warm included."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def steady_reuse(self) -> float:
        """Σ cached / Σ prompt over the turns' calls only (the pre-warmed prefix counts as cached)."""
        calls = self.turn_calls
        prompt = sum(c.stats.prompt_tokens for c in calls)
        return sum(c.stats.cached_tokens for c in calls) / prompt if prompt else 0.0

    @property
    def trim_calls(self) -> list[EngineCallFinished]:
        """The calls whose prompt the context budget trimmed (whole old turns dropped)."""
        return [c for c in self.turn_calls if getattr(c, "trimmed_tokens", 0) > 0]

    @property
    def untrimmed_reuse(self) -> float:
        """Σ cached / Σ prompt over the turns' calls that are not trims."""
        calls = [c for c in self.turn_calls if getattr(c, "trimmed_tokens", 0) == 0]
        prompt = sum(c.stats.prompt_tokens for c in calls)
        return sum(c.stats.cached_tokens for c in calls) / prompt if prompt else 0.0

    @property
    def reusable_tokens(self) -> int:
        return sum(c.reusable_tokens for c in self.turn_calls)

    @property
    def reusable(self) -> float:
        prompt = sum(c.stats.prompt_tokens for c in self.turn_calls)
        return self.reusable_tokens / prompt if prompt else 0.0


def run_task(agent: Agent, task: Task, on_event: Callable[[Event], None] | None = None,
             prewarm: bool = False) -> TaskReport:
    """Run every step through the agent (after its pre-warm when `prewarm`); collect the ledger,
    prefix breaks and lint. Every event goes to `on_event` too."""
    report = TaskReport()

    def seen(ev: Event) -> None:
        if on_event:
            on_event(ev)
        if isinstance(ev, EngineCallFinished):
            report.calls.append(ev)
        elif isinstance(ev, PrefixBreak):
            report.breaks.append(ev)
        elif isinstance(ev, PromptLinted):
            report.lint = ev.issues
        elif isinstance(ev, TurnFailed):
            report.failures.append(f"turn {ev.turn}: {ev.error}")

    if prewarm:
        for ev in agent.prewarm():
            seen(ev)
    for step in task.steps:
        for ev in agent.run_turn(step.user, step.tool_choice):
            seen(ev)
    return report


def format_report(task: Task, report: TaskReport, min_reuse: float, gate: str) -> Iterator[str]:
    """Human lines: one per engine call, the breaks, the lint, the totals and the verdict."""
    yield f"task {task.name} ({task.source}): {len(task.steps)} steps, {len(report.calls)} engine calls"
    yield f"{'call':>4} {'turn':>4} {'choice':<14} {'prompt':>6} {'cached':>6} {'reusable':>8} {'out':>4} {'prefill_s':>9}"
    for c in report.calls:
        s = c.stats
        yield (f"{c.call:>4} {c.turn:>4} {c.tool_choice:<14} {s.prompt_tokens:>6} {s.cached_tokens:>6} "
               f"{c.reusable_tokens:>8} {c.output_tokens:>4} {s.prefill_s:>9.2f}"
               + (f"  trimmed: {c.trimmed_tokens} dropped, {c.trim_recomputed_tokens} recomputed"
                  if getattr(c, "trimmed_tokens", 0) else ""))
    for issue in report.lint:
        yield f"lint: {issue}"
    for b in report.breaks:
        yield (f"prefix break at call {b.call} ({b.cause}): token {b.index} in segment '{b.segment}'"
               f" (promised {b.promised_tokens}, cached {b.cached_tokens})")
        yield f"    …{b.before!r} | was {b.old!r} | now {b.new!r}"
    for f in report.failures:
        yield f"failure: {f}"
    warm = [c for c in report.calls if is_prewarm(c)]
    yield (f"cumulative: prompt {report.prompt_tokens}, cached {report.cached_tokens}: engine reuse {report.reuse:.1%} "
           f"including the pre-warm" + (f" (call 0: {warm[0].stats.computed_tokens} tokens computed)" if warm else " (none ran)"))
    yield (f"steady state (the turns' calls only, the pre-warmed prefix counted as cached): engine reuse "
           f"{report.steady_reuse:.1%}; reusable {report.reusable_tokens} (token comparison {report.reusable:.1%})")
    trims = report.trim_calls
    yield (f"context trims: {len(trims)} call(s)" + (f" ({', '.join(str(c.call) for c in trims)})" if trims else "")
           + f"; engine reuse without the trim calls {report.untrimmed_reuse:.1%}, with them {report.steady_reuse:.1%}")
    if report.cached_tokens == 0:
        yield "note: no token was served from the prefix cache (cache off, or nothing to reuse)"


def gate_passes(report: TaskReport, min_reuse: float, gate: str = "engine") -> tuple[bool, str]:
    value = report.reuse if gate == "engine" else report.reusable
    label = "engine reuse (pre-warm included)" if gate == "engine" else "reusable (token comparison)"
    if report.failures:
        return False, f"FAIL: {len(report.failures)} turn(s) failed"
    if value >= min_reuse:
        return True, f"PASS: {label} {value:.1%} >= {min_reuse:.0%}"
    where = (f"; first break in segment '{report.breaks[0].segment}' at call {report.breaks[0].call}"
             if report.breaks else "; no prefix break in the prompts (cache off, evicted or too small)")
    return False, f"FAIL: {label} {value:.1%} < {min_reuse:.0%}{where}"
