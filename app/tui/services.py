"""What the console is given by the composition root (app/__main__.py), and the turn pump.

The console never imports `tools` or the store: __main__ passes a `Builder` that turns
ConsoleOptions into a loaded engine + agent, reporting progress. `pump_events` is the body of
the turn worker: it runs in a worker thread, iterates the agent's event generator and posts
messages, coalescing TokenDelta text (one TokensStreamed per `interval` at most).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields, replace

from app.events import EngineCallFinished, EngineCallStarted, TokenDelta, TurnFailed, TurnFinished
from app.tui.messages import AgentEventReceived, PoolSampled, TokensStreamed

Progress = Callable[[str, "float | None"], None]


@dataclass(frozen=True)
class ConsoleOptions:
    """The settings screen's fields; a change is applied by reloading the engine."""

    model: str = "smollm2-135m"
    weights: str = "nvfp4"  # nvfp4 | w4a8 | f16 | f32
    kv: str = "f32"  # f32 | f16 | nvfp4
    threads: int = 0  # 0: all cores
    kv_pages: int = 0  # 0: enough for the model's max context
    prewarm: bool = True  # compute + pin the system + tools prefix before the first turn
    trim_ahead: bool = True  # after a turn, the trim the next one would need, computed while the user types
    tool_choice: str = "auto"  # auto | required | none | a tool's name
    tools: bool = True  # False: the agent has no tools (a plain chat)
    max_tokens: int = 200
    confirm_tools: tuple[str, ...] = ("add_reminder", "draft_email")  # asked before they run (the outbox)

    def with_(self, **changes) -> ConsoleOptions:
        known = {f.name for f in fields(self)}
        bad = sorted(set(changes) - known)
        if bad:
            raise ValueError(f"ConsoleOptions has no field {', '.join(bad)} (known: {', '.join(sorted(known))})")
        return replace(self, **changes)


@dataclass(frozen=True)
class SessionHooks:
    """What the composition root does around a loaded agent's events (the store's writer).

    start(agent) -> the session's first events (SessionStarted, the pre-warm's), already given to
    on_event; it replaces the console's own agent.prewarm(). on_event(ev) sees every later event,
    on the worker thread, before the UI does. end(agent) closes the session (reload, quit)."""

    start: Callable[[object], list] | None = None
    on_event: Callable[[object], None] | None = None
    end: Callable[[object], None] | None = None


@dataclass(frozen=True)
class Loaded:
    """A loaded engine and the agent on it; owned by the app until the next reload."""

    engine: object
    agent: object
    options: ConsoleOptions
    load_s: float = 0.0
    hooks: SessionHooks = SessionHooks()


# build(options, progress) -> (engine, agent) or (engine, agent, SessionHooks); raises
# EngineError / ConfigError / ValueError naming what is wrong.
Builder = Callable[[ConsoleOptions, Progress], tuple]


def pump_events(events: Iterable, post: Callable[[object], None], engine=None, *, interval: float = 0.05,
                telemetry=None, sink: Callable[[object], None] | None = None,
                cancelled: Callable[[], bool] = lambda: False, clock: Callable[[], float] = time.monotonic) -> str:
    """Iterate `events` (an agent turn), posting messages; returns finished | failed | cancelled.

    TokenDelta text is buffered and posted as one TokensStreamed when `interval` has passed since
    the last flush, and before any other event. After every EngineCallFinished the pool
    snapshot is posted too (engine.snapshot(): a cheap copy). When `cancelled()` turns true the
    generator is closed (the engine call in flight ends as "cancelled"). With `telemetry` (an
    app.telemetry Sampler, duck-typed: summarize(t0, t1, tokens)), an EngineCallFinished without
    a telemetry summary gets one over [EngineCallStarted.t_mono, its own t_mono]."""
    buf: list[str] = []
    key = (0, 0)
    last = clock()
    outcome = "finished"

    def flush() -> None:
        nonlocal last
        if buf:
            post(TokensStreamed(key[0], key[1], "".join(buf)))
            buf.clear()
        last = clock()

    started = 0.0
    it = iter(events)
    try:
        for ev in it:
            if isinstance(ev, TokenDelta):
                if sink is not None:
                    sink(ev)
                if (ev.turn, ev.call) != key:
                    flush()
                    key = (ev.turn, ev.call)
                buf.append(ev.text)
                if clock() - last >= interval:
                    flush()
            else:
                flush()
                if isinstance(ev, EngineCallStarted):
                    started = ev.t_mono
                elif isinstance(ev, EngineCallFinished) and telemetry is not None and ev.telemetry is None and started:
                    st = ev.stats
                    tel = telemetry.summarize(started, ev.t_mono, st.computed_tokens + st.decode_tokens)
                    ev = replace(ev, telemetry=tel.as_dict())
                if sink is not None:
                    sink(ev)
                post(AgentEventReceived(ev))
                if isinstance(ev, EngineCallFinished) and engine is not None:
                    post(PoolSampled(engine.snapshot(), tree=engine.tree()))
                if isinstance(ev, TurnFailed):
                    outcome = "failed"
                elif isinstance(ev, TurnFinished):
                    outcome = "finished"
            if cancelled():
                outcome = "cancelled"
                break
    finally:
        flush()
        close = getattr(it, "close", None)
        if close is not None:
            close()
    return outcome
