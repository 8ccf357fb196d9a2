"""The terminal front ends that store their sessions: `kvdeck chat`, `kvdeck run` (and the pieces
`kvdeck check-prefix --db` and `kvdeck replay`, app/replay_cli.py, share).

A composition-root helper of app/__main__.py (which passes in how to build the tool functions,
since only __main__ imports `tools`). The agent runs in a worker thread; this thread prints its
events and feeds them to the store's writer. Ctrl-C cancels the running engine call
(Agent.cancel → Generation.cancel): the turn ends in TurnFailed('cancelled'), the conversation is
rolled back to before it, and the session goes on.
"""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson

from app.config import RunConfig, file_sha256, load_settings
from app.events import (EngineCallFinished, Event, TokenDelta, ToolCalled, ToolReturned, TurnFailed, TurnFinished)

# (agent settings, tool names or None) -> (functions, setup for a tool process)
Toolbox = Callable[..., tuple[list, tuple | None]]


# ---- composition ----------------------------------------------------------------------------
def db_path(args) -> Path:
    from app.config import default_db_path

    return Path(getattr(args, "db", None) or load_settings().store.path or default_db_path())


def engine_for(run: RunConfig):
    """An engine as `run` describes it (weights and their activations, KV, threads, pool pages and block,
    prefix cache)."""
    from app.engine import load_engine

    return load_engine(run.model, weights=run.weight_format, kv=run.kv_format, threads=run.threads or None,
                       kv_pages=run.kv_pages or None, prefix_cache=run.prefix_cache, kv_block=run.kv_block,
                       device=run.backend, activations=run.activations)


def make_agent(eng, toolbox: Toolbox, *, sampling, max_tokens: int | None = None, follow_up: str | None = None,
               session_id: str = "", executor=None, system_prompt: str | None = None, tools: bool = True,
               tool_names: tuple[str, ...] | None = None, system_timestamp: bool = False, run: RunConfig | None = None,
               clock=None):
    """settings → tools → Agent. With `run`, its limits win (a replay / resume keeps the recorded ones)."""
    from app.agent import Agent, AgentLimits, Toolkit
    from app.agent.budget import BudgetPolicy
    from app.agent.executor import ProcessExecutor
    from app.agent.prompt import SYSTEM_PROMPT

    a = load_settings().agent
    fns, setup = toolbox(a, tool_names) if tools else ([], None)
    kit = Toolkit(fns, timeout_s=a.tool_timeout_s)
    if run is not None:
        limits = AgentLimits(run.max_steps, run.max_tokens, run.call_max_tokens, run.follow_up)
    else:
        limits = AgentLimits(max_steps=a.max_steps, max_tokens=min(max_tokens or a.max_tokens, a.max_tokens),
                             follow_up=follow_up or a.follow_up)
    return Agent(eng, kit, limits=limits, sampling=sampling, system_prompt=system_prompt or SYSTEM_PROMPT,
                 system_timestamp=system_timestamp, session_id=session_id, clock=clock,
                 executor=executor or ProcessExecutor(kit, setup), budget=BudgetPolicy(a.trim_low_water, a.context_tokens, a.trim_ahead))


def start(agent, writer, *, prewarm: bool, title: str = "", parent_id: str = "", model: str | None = None,
          sink: Callable[[Event], None] | None = None, run_prewarm: bool = True) -> RunConfig:
    """Emit SessionStarted (with the RunConfig), then the pre-warm's events, to the writer and `sink`.
    run_prewarm=False: the RunConfig says `prewarm` but the caller runs agent.prewarm() itself."""
    prewarm = prewarm and agent.engine.prefix_cache
    agent.prewarmed = prewarm  # recorded as intended; prewarm() below makes it so
    sha = file_sha256(agent.engine.folder / "model.safetensors") if writer else ""
    run = agent.run_config(workspace=load_settings().agent.workspace, model=model, model_sha256=sha)
    events = [agent.session_started(run, title, parent_id)]
    if prewarm and run_prewarm:
        events += agent.prewarm()
    for ev in events:
        if writer:
            writer(ev)
        if sink:
            sink(ev)
    return run


class TelemetryTap:
    """Fills EngineCallFinished.telemetry from a telemetry Sampler (app.telemetry) before the store
    sees it: temperatures, power and energy over [EngineCallStarted.t_mono, EngineCallFinished.t_mono].
    Wraps a sink; `stop()` ends the sampler. A machine with no working source stores nothing."""

    def __init__(self, sink: Callable[[Event], None]):
        from app.telemetry import Sampler

        self.sink = sink
        self.sampler = Sampler(interval=1.0).start()
        self.started: dict[tuple[str, int], float] = {}

    def __call__(self, ev: Event) -> None:
        from dataclasses import replace

        from app.events import EngineCallStarted

        if isinstance(ev, EngineCallStarted):
            self.started[(ev.session_id, ev.call)] = ev.t_mono
        elif isinstance(ev, EngineCallFinished) and ev.telemetry is None:
            t0 = self.started.pop((ev.session_id, ev.call), ev.t_mono - ev.stats.prefill_s - ev.stats.decode_s)
            tel = self.sampler.summarize(t0, ev.t_mono, ev.stats.computed_tokens + ev.stats.decode_tokens, fresh=False)
            if tel.samples or tel.temps_c or tel.energy_j is not None:
                ev = replace(ev, telemetry=tel.as_dict())
        self.sink(ev)

    def stop(self) -> None:
        self.sampler.stop()


def open_writer(args, kind: str):
    if getattr(args, "no_store", False):
        return None
    from app.store import StoreWriter

    return Stored(StoreWriter(db_path(args), kind=kind))


class Stored:
    """The store's writer behind a TelemetryTap: call it with events; end_session / close as the writer's."""

    def __init__(self, writer):
        self.writer = writer
        self.path = writer.path
        self.tap = TelemetryTap(writer)

    def __call__(self, ev: Event) -> None:
        self.tap(ev)

    @property
    def turn_ms(self) -> list[float]:
        return self.writer.turn_ms

    def end_session(self, sid: str) -> None:
        self.writer.end_session(sid)

    def close(self) -> None:
        self.tap.stop()
        self.writer.close()


def drive(agent, events: Callable[[], Iterator[Event]], on_event: Callable[[Event], None]) -> bool:
    """Run the generator `events()` in a worker thread, handing each event to `on_event` here.
    Ctrl-C cancels the engine call instead of raising. Returns True when Ctrl-C was pressed."""
    q: queue.SimpleQueue = queue.SimpleQueue()
    done = object()

    def work() -> None:
        try:
            for ev in events():
                q.put(ev)
        except BaseException as e:  # handed to this thread
            q.put(("error", e))
        finally:
            q.put(done)

    worker = threading.Thread(target=work, name="kvdeck-agent", daemon=True)
    worker.start()
    interrupted = False
    while True:
        try:
            try:
                item = q.get(timeout=0.1)
            except queue.Empty:
                continue
            if item is done:
                break
            if isinstance(item, tuple):
                raise item[1]
            on_event(item)
        except KeyboardInterrupt:
            if not interrupted:
                sys.stderr.write("\n[Ctrl-C: cancelling the reply…]\n")
            interrupted = True
            agent.cancel()
    worker.join()
    return interrupted


class Ahead:
    """`kvdeck chat`'s trim-ahead: Agent.trim_ahead() in a thread while the user types the next
    message; its events go to the store as they come. join() (before the next turn) cancels what is
    left of it (the pages done stay cached) and returns a line saying what it did, or ""."""

    def __init__(self, agent, sink: Callable[[Event], None] | None):
        self.agent = agent
        self.calls: list[EngineCallFinished] = []
        self.error = ""

        def work() -> None:
            try:
                for ev in agent.trim_ahead():
                    if isinstance(ev, EngineCallFinished):
                        self.calls.append(ev)
                    if sink is not None:
                        sink(ev)
            except Exception as e:  # the trim stands; the next call computes what is missing
                self.error = f"{type(e).__name__}: {e}"

        self.thread = threading.Thread(target=work, name="kvdeck-trim-ahead", daemon=True)
        self.thread.start()

    def join(self) -> str:
        if self.thread.is_alive():
            self.agent.cancel()
        self.thread.join()
        if self.error:
            return f"[trim ahead failed: {self.error}]"
        if not self.calls:
            return ""
        c = self.calls[-1]
        cut = " — cut short by your message, the next call computes the rest" if c.stats.finish_reason == "cancelled" else ""
        return (f"[context trimmed ahead after turn {c.turn}: {c.trimmed_tokens} oldest tokens dropped, "
                f"{c.trim_recomputed_tokens} kept tokens computed in {c.stats.prefill_s:.1f} s while you typed{cut}]")


# ---- printing -----------------------------------------------------------------------------
def pool_advice(agent) -> str:
    snap = agent.engine.snapshot()
    return (f"the pool holds {snap.get('total_pages')} pages of {snap.get('block')} tokens. Send a shorter "
            "message, start a new session (/new), or give a larger pool (--kv-pages N)")


class Printer:
    """Prints a turn's events as a chat does (text to stdout, tools and figures to stderr)."""

    def __init__(self, agent, json_lines: bool = False):
        self.agent = agent
        self.json = json_lines
        self.called: dict = {}
        self.last: EngineCallFinished | None = None
        self.failed: TurnFailed | None = None

    def __call__(self, ev: Event) -> None:
        if isinstance(ev, EngineCallFinished):
            self.last = ev
        if isinstance(ev, TurnFailed):
            self.failed = ev
        if self.json:
            line = json_line(ev, self.called)
            if line is not None:
                sys.stdout.write(orjson.dumps(line, default=str).decode() + "\n")
                sys.stdout.flush()
            return
        if isinstance(ev, TokenDelta):
            sys.stdout.write(ev.text)
            sys.stdout.flush()
        elif isinstance(ev, ToolCalled):
            sys.stdout.write("\n")
            sys.stderr.write(f"[tool {ev.name or '?'} {orjson.dumps(ev.arguments).decode()}]\n")
        elif isinstance(ev, ToolReturned):
            sys.stderr.write(f"[{ev.outcome or ('ok' if ev.ok else 'error')} {ev.content[:200]}]\n")
        elif isinstance(ev, TurnFinished):
            sys.stdout.write("\n")
            st = self.last.stats if self.last else None
            if st is not None:
                sys.stderr.write(f"[{st.prompt_tokens} prompt tok ({st.cached_tokens} cached), ttft "
                                 f"{st.ttft_s * 1000:.0f} ms, {st.decode_tokens} tok at {st.decode_tok_s:.1f} tok/s, "
                                 f"{st.weight_format}/{st.kv_format}, {st.finish_reason}]\n")
        elif isinstance(ev, TurnFailed):
            kind = ev.details.get("kind")
            if kind == "cancelled":
                sys.stderr.write("\n[cancelled: the reply was stopped and the turn dropped; the conversation "
                                 "is as it was before it]\n")
            elif kind == "pool_full":
                sys.stderr.write(f"\n[{ev.error}: the conversation no longer fits the KV pool; "
                                 f"{pool_advice(self.agent)}]\n")
            else:
                sys.stderr.write(f"\nkvdeck: turn failed: {ev.error}\n")


def json_line(ev, called: dict) -> dict | None:
    """The --json line for an event (None for the ones not printed: token deltas, starts)."""
    from app.events import PrefixBreak, PromptLinted

    if isinstance(ev, ToolCalled):
        called[ev.call_id] = ev
        return None
    if isinstance(ev, ToolReturned):
        c = called.get(ev.call_id)
        return {"event": "tool_call", "turn": ev.turn, "id": ev.call_id, "name": ev.name,
                "arguments": c.arguments if c else None, "ok": ev.ok, "result": ev.content,
                "outcome": ev.outcome, "elapsed_s": round(ev.elapsed_s, 4)}
    if isinstance(ev, EngineCallFinished):
        return {"event": "engine_call"} | {k: v for k, v in ev.as_dict().items() if k != "event"}
    if isinstance(ev, (PrefixBreak, PromptLinted, TurnFinished, TurnFailed)):
        return ev.as_dict()
    return None


# ---- kvdeck run / kvdeck chat ------------------------------------------------------------------
def run_once(args, eng, toolbox: Toolbox) -> int:
    """`kvdeck run PROMPT`: one agent turn, stored unless --no-store. Exit 0, 1 (failed), 130 (Ctrl-C)."""
    from app.store import new_id

    writer = open_writer(args, "run")
    sid = new_id()
    agent = make_agent(eng, toolbox, sampling=args.sampling, max_tokens=args.max_tokens, session_id=sid,
                       system_prompt=args.system)
    printer = Printer(agent, args.json)
    try:
        start(agent, writer, prewarm=not args.no_prewarm, title=args.prompt[:60], model=args.model_name,
              sink=printer)  # --json prints the pre-warm's ledger line too
        sink = (lambda ev: (writer(ev), printer(ev))) if writer else printer
        interrupted = drive(agent, lambda: agent.run_turn(args.prompt, args.tool_choice), sink)
    finally:
        agent.close()
        if writer:
            writer.end_session(sid)
            writer.close()
    if writer and not args.json:
        sys.stderr.write(f"[session {sid[:7]} stored in {writer.path}]\n")
    return 130 if interrupted else (1 if printer.failed else 0)


def chat(args, load: Callable[[], object], toolbox: Toolbox) -> int:
    """`kvdeck chat [--resume ID]`: a terminal conversation with the agent, stored unless --no-store."""
    from app.store import Store, new_id

    writer = open_writer(args, "chat")
    resume = None
    if args.resume:
        store = Store.open(db_path(args))
        sid = store.resolve(args.resume)
        calls, turns = store.db.execute("SELECT (SELECT coalesce(max(call), 0) FROM engine_calls WHERE session_id = ?), "
                                        "(SELECT coalesce(max(turn), 0) FROM turns WHERE session_id = ?)",
                                        [sid, sid]).fetchone()
        resume = (store.run_config(sid), store.conversation(sid), calls, turns)
        store.close()
        eng = engine_for(resume[0])  # as the session ran (weights, KV, pool)
    else:
        sid = new_id()
        eng = load()

    def new_agent(session_id: str):
        system = args.system
        if resume:
            system = next((m[2] for m in resume[1] if m[0] == 0 and m[1] == "system"), system)
        return make_agent(eng, toolbox, sampling=args.sampling, max_tokens=args.max_tokens, session_id=session_id,
                          system_prompt=system, tools=not args.no_tools, run=resume[0] if resume else None,
                          tool_names=resume[0].tools if resume and not args.no_tools else None)

    agent = new_agent(sid)
    if resume:
        agent.restore(resume[1], resume[2], resume[3])
    start(agent, writer, prewarm=not args.no_prewarm, title="chat", model=args.model_name)
    where = f"stored as session {sid[:7]} in {writer.path}" if writer else "not stored"
    print(f"kvdeck chat — {eng.config.model} ({eng.weight_format} weights, {eng.kv_format} KV, {eng.backend}); "
          f"{where}" + (f"; resumed after turn {agent.turn}" if resume else "") +
          ". Ctrl-C stops a reply; /new starts a new session; empty line or Ctrl-D quits.")
    ahead = None
    try:
        while True:
            try:
                line = input("> ").strip()
            except (EOFError, KeyboardInterrupt):
                print()
                return 0
            if ahead is not None:
                note, ahead = ahead.join(), None
                if note:
                    print(note)
            if not line:
                return 0
            if line == "/new":
                agent.close()
                if writer:
                    writer.end_session(agent.session_id)
                resume, sid = None, new_id()
                agent = new_agent(sid)
                start(agent, writer, prewarm=not args.no_prewarm, title="chat", model=args.model_name)
                print(f"[new session {sid[:7]}]")
                continue
            printer = Printer(agent)
            sink = (lambda ev, p=printer: (writer(ev), p(ev))) if writer else printer
            if not drive(agent, lambda: agent.run_turn(line, args.tool_choice), sink) and not printer.failed:
                ahead = Ahead(agent, writer)  # a trim the next turn would need, while the user types
    finally:
        if ahead is not None:
            ahead.join()
        agent.close()
        if writer:
            writer.end_session(agent.session_id)
            writer.close()
