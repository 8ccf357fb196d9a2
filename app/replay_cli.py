"""`kvdeck replay ID|FILE [--with k=v,...|--rerun] [--json]`: a stored session with its ledger, or
re-run under another RunConfig with the recorded tool results fed back, the two ledgers side by
side and a summary in the shape of seed 000's table. The replay is stored, linked to its source.

A composition-root helper of app/__main__.py (it passes in the toolbox: only __main__ imports `tools`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from app.chat import Toolbox, db_path, drive, engine_for, make_agent, open_writer, start
from app.events import EngineCallFinished, Event, TurnFailed, TurnFinished


class Ledger:
    """Collects a replay's engine_calls rows (as the store has them) and its answers."""

    def __init__(self):
        self.calls: list[dict] = []
        self.answers: list[str | None] = []

    def __call__(self, ev: Event) -> None:
        from app.events import KVSnapshot
        from app.store.writer import call_row, snapshot_columns

        if isinstance(ev, EngineCallFinished):
            self.calls.append(call_row(ev.session_id, ev))
        elif isinstance(ev, KVSnapshot) and self.calls and self.calls[-1]["call"] == ev.call:
            self.calls[-1] |= snapshot_columns(ev)
        elif isinstance(ev, TurnFinished):
            self.answers.append(ev.answer)
        elif isinstance(ev, TurnFailed):
            self.answers.append(None)


def replay(args, toolbox: Toolbox) -> int:
    """`kvdeck replay ID|FILE [--with k=v,...|--rerun] [--json]`. A FILE (an export) is imported first."""
    import json

    from app.config import parse_changes
    from app.engine import SamplingParams
    from app.store import Store, new_id
    from app.store import replay as rp
    from app.store.export import import_file

    store = Store.open(db_path(args))
    if Path(args.id).is_file():
        sid = json.loads(Path(args.id).read_text()).get("session", {}).get("id", "")
        if not sid or not store.db.execute("SELECT 1 FROM sessions WHERE id = ?", [sid]).fetchone():
            sid = import_file(store, args.id)
    else:
        sid = store.resolve(args.id)
    run = store.run_config(sid)
    src_calls, turns = store.rows("engine_calls", sid), rp.recorded_turns(store, sid)
    src_answers = [t.answer for t in turns]
    if args.with_ is None and not args.rerun:
        from app.store.cli import show

        show(store, sid)
        return 0
    changes = parse_changes(args.with_ or "")
    if ({"weight_format", "backend"} & changes.keys()) and "activations" not in changes:
        changes["activations"] = "auto"  # the recorded a16 belongs to the recorded weights and device
    new_run = run.with_(**changes)
    eng = engine_for(new_run)
    ledger, writer, new_sid = Ledger(), (None if args.no_store else open_writer(args, "replay")), new_id()
    exe = rp.recorded_executor(store, sid)
    agent = make_agent(eng, toolbox, sampling=SamplingParams(new_run.temperature, new_run.top_k, new_run.top_p,
                                                             new_run.seed),
                       session_id=new_sid, executor=exe, system_prompt=rp.system_prompt_of(store, sid),
                       tool_names=new_run.tools, run=new_run, clock=rp.recorded_clock(turns))
    notes = []
    recorded_static = [i for m in store.conversation(sid) if m[0] == 0 for i in m[3]]
    if recorded_static and agent.prompt.ids[: agent.prompt.segments[1].end] != recorded_static:
        notes.append("the system prompt or tool schemas differ from the recording (tools changed since): "
                     "the replay's prompts are not the recorded ones")
    if run.model_sha256 and new_run.weight_format == run.weight_format:
        from app.config import file_sha256

        if file_sha256(eng.folder / "model.safetensors") != run.model_sha256:
            notes.append(f"the {new_run.weight_format} weights differ from the recorded ones (sha256)")
    label = args.with_ or "its own configuration"
    if not args.json:
        sys.stderr.write(f"replaying {sid[:7]} ({len(turns)} turns) under {label}…\n")
    sink = (lambda ev: (writer(ev), ledger(ev))) if writer else ledger
    try:
        start(agent, writer, prewarm=new_run.prewarm, title=f"replay of {sid[:7]} with {label}", parent_id=sid,
              model=new_run.model, sink=ledger)
        for i, t in enumerate(turns):
            if drive(agent, lambda t=t: agent.run_turn(t.user_text, t.tool_choice), sink) or (
                    i + 1 < len(turns) and drive(agent, agent.trim_ahead, sink)):  # as the console does between turns
                sys.stderr.write("kvdeck: replay interrupted\n")
                return 130
    finally:
        agent.close()
        if writer:
            writer.end_session(new_sid)
            writer.close()
    cmp = rp.compare(rp.summary(src_calls, src_answers), rp.summary(ledger.calls, ledger.answers))
    cmp |= {"source_id": sid, "replay_id": new_sid if writer else None, "with": args.with_ or "",
            "tool_mismatches": exe.mismatches, "notes": notes, "source_run": run.as_dict(), "replay_run": new_run.as_dict()}
    if args.json:
        sys.stdout.write(json.dumps(cmp | {"source_calls": src_calls, "replay_calls": ledger.calls}, default=str) + "\n")
        return 0
    a_label = f"{run.weight_format}/{run.kv_format} cache {'on' if run.prefix_cache else 'off'} " \
              f"prewarm {'on' if run.prewarm else 'off'}"
    b_label = f"{new_run.weight_format}/{new_run.kv_format} cache {'on' if new_run.prefix_cache else 'off'} " \
              f"prewarm {'on' if new_run.prewarm else 'off'}"
    for line in rp.side_by_side(src_calls, ledger.calls, f"source {sid[:7]}: {a_label}", f"replay: {b_label}"):
        print(line)
    print()
    for line in rp.summary_table(cmp, a_label, b_label):
        print(line)
    for m in exe.mismatches + notes:
        print(f"note: {m}")
    if writer:
        print(f"replay stored as session {new_sid[:7]} (parent {sid[:7]})")
    return 0
