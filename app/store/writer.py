"""The store's writer: the agent's events → the database, on one thread of its own.

    writer = StoreWriter(path, kind="chat")
    for ev in agent.run_turn(...):
        writer(ev)                 # never blocks: a queue to the writer thread
    writer.end_session(sid)
    writer.close()                 # drains the queue, then stops

A turn is committed in one transaction when its TurnFinished / TurnFailed arrives; its
TurnStarted is committed at once as a 'running' row, so a crash mid-turn leaves the completed
turns intact and the interrupted one marked (Store.open turns it 'incomplete'). Events outside a
turn (turn 0: the static prefix and the pre-warm) are committed whenever the queue runs dry.
`turn_ms` holds the writer's time per committed turn (the store's cost per turn).
"""

from __future__ import annotations

import json
import queue
import sys
import threading
import time
from dataclasses import dataclass, field

from app.events import (CacheEvent, EngineCallFinished, KVSnapshot, MessageAdded, SessionStarted, ToolCalled,
                        ToolReturned, TurnFailed, TurnFinished, TurnStarted)
from app.store.db import _immediate, connect, pack_ids
from app.store.schema import CALL_CONTEXT, CALL_STATS


@dataclass
class _Open:
    """One session's unwritten rows (the turn in flight, or turn 0)."""

    seq: int = 0
    turn: int = 0
    rows: dict = field(default_factory=dict)  # table → [row dicts]
    last_call: dict | None = None

    def add(self, table: str, row: dict) -> dict:
        self.rows.setdefault(table, []).append(row)
        return row


def telemetry_row(sid: str, turn: int, call: int, t: dict) -> dict:
    """A telemetry row from a CallTelemetry dict (app.telemetry): temperatures over all zones."""
    temps = (t.get("temps_c") or {}).values()
    return {"session_id": sid, "turn": turn, "call": call, "source": t.get("source", ""),
            "samples": t.get("samples", 0),
            "temp_min_c": min((z["min"] for z in temps), default=None),
            "temp_max_c": max((z["max"] for z in temps), default=None),
            "temp_mean_c": (sum(z["mean"] for z in temps) / len(temps)) if temps else None,
            "energy_j": t.get("energy_j"), "power_mean_w": t.get("mean_power_w"),
            "peak_power_w": t.get("peak_power_w"), "throttled": int(bool(t.get("throttled"))),
            "detail": json.dumps(t, default=str)}


def call_row(sid: str, ev: EngineCallFinished) -> dict:
    """An engine_calls row from an EngineCallFinished (the pool columns come from its KVSnapshot)."""
    row = {"session_id": sid, "turn": ev.turn, "call": ev.call, "kind": getattr(ev.stats, "kind", "generate"),
           "tool_choice": ev.tool_choice, "reusable_tokens": ev.reusable_tokens, "output_tokens": ev.output_tokens,
           "t_wall": ev.t_wall}
    for name, _ in CALL_STATS:
        row[name] = getattr(ev.stats, name, None)
    for name, _ in CALL_CONTEXT:  # on the event (budget, trims) or the stats (events_dropped)
        row[name] = getattr(ev, name, getattr(ev.stats, name, None))
    return row


def snapshot_columns(ev: KVSnapshot) -> dict:
    return {"kv_total_pages": ev.total_pages, "kv_block": ev.block, "kv_bytes_per_token": ev.bytes_per_token}


class StoreWriter:
    """Consumes events (call it with each one); owns its connection and thread. Thread-safe to call."""

    def __init__(self, path, kind: str = "chat"):
        self.path = str(path)
        self.kind = kind
        self.turn_ms: list[float] = []
        self.errors: list[str] = []
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._open: dict[str, _Open] = {}
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvdeck-store", daemon=True)
        self._thread.start()
        self._ready.wait(30)
        if self.errors:
            from app.store.db import StoreError

            raise StoreError(f"{self.path}: cannot open the sessions database ({self.errors[0]})")

    # ---- the caller's side ----------------------------------------------------------------
    def __call__(self, event) -> None:
        self._q.put(event)

    def end_session(self, sid: str) -> None:
        self._q.put(("end", sid))

    def flush(self, timeout: float = 30.0) -> bool:
        done = threading.Event()
        self._q.put(("flush", done))
        return done.wait(timeout)

    def close(self, timeout: float = 30.0) -> None:
        if self._thread.is_alive():
            self._q.put(None)
            self._thread.join(timeout)

    # ---- the writer thread ------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self.db = connect(self.path)
        except Exception as e:  # reported by __init__
            self.errors.append(f"{type(e).__name__}: {e}")
            self._ready.set()
            return
        self._ready.set()
        while True:
            item = self._q.get()
            if item is None:
                break
            try:
                self._handle(item)
                if self._q.empty():
                    self._write_idle()
            except Exception as e:  # never take the agent down; say so once per kind of fault
                msg = f"{type(e).__name__}: {e}"
                if msg not in self.errors:
                    sys.stderr.write(f"kvdeck: store: {msg}\n")
                self.errors.append(msg)
        for sid in list(self._open):
            self._end(sid)
        self.db.close()

    def _handle(self, item) -> None:
        if isinstance(item, tuple):
            if item[0] == "end":
                self._end(item[1])
            elif item[0] == "flush":
                self._write_idle()
                item[1].set()
            return
        ev = item
        sid = getattr(ev, "session_id", "")
        if not sid:
            return
        if isinstance(ev, SessionStarted):
            self._session(ev)
            return
        st = self._open.get(sid) or self._resume(sid)
        if isinstance(ev, TurnStarted):
            self._write_idle()
            st.turn = ev.turn
            with _immediate(self.db):
                self.db.execute("INSERT INTO turns (session_id, turn, user_text, tool_choice, now, status, "
                                "started) VALUES (?, ?, ?, ?, ?, 'running', ?)",
                                [sid, ev.turn, ev.user_text, ev.tool_choice, ev.now, ev.t_wall])
        elif isinstance(ev, MessageAdded):
            st.add("messages", {"session_id": sid, "turn": ev.turn, "seq": st.seq, "role": ev.role,
                                "content": ev.content, "start": ev.start, "end": ev.end,
                                "token_ids": pack_ids(ev.ids), "t_wall": ev.t_wall})
            st.seq += 1
        elif isinstance(ev, EngineCallFinished):
            st.last_call = st.add("engine_calls", call_row(sid, ev))
            if ev.telemetry:
                st.add("telemetry", telemetry_row(sid, ev.turn, ev.call, ev.telemetry))
        elif isinstance(ev, KVSnapshot):
            if st.last_call is not None and (st.last_call["turn"], st.last_call["call"]) == (ev.turn, ev.call):
                st.last_call |= snapshot_columns(ev)
        elif isinstance(ev, CacheEvent):
            st.add("cache_events", {"session_id": sid, "turn": ev.turn, "call": ev.call, "kind": ev.kind,
                                    "engine_session": ev.engine_session, "pages": ev.pages, "tokens": ev.tokens,
                                    "prefix_tokens": ev.prefix_tokens, "head_text": ev.head_text,
                                    "reason": ev.reason, "t_wall": ev.t_wall})
        elif isinstance(ev, ToolCalled):
            st.add("tool_calls", {"session_id": sid, "turn": ev.turn, "call_id": ev.call_id, "name": ev.name,
                                  "arguments": json.dumps(ev.arguments, default=str), "raw": ev.raw,
                                  "t_wall": ev.t_wall})
        elif isinstance(ev, ToolReturned):
            st.add("tool_results", {"session_id": sid, "turn": ev.turn, "call_id": ev.call_id, "name": ev.name,
                                    "ok": int(ev.ok), "content": ev.content, "elapsed_s": ev.elapsed_s,
                                    "outcome": ev.outcome, "t_wall": ev.t_wall})
        elif isinstance(ev, (TurnFinished, TurnFailed)):
            t0 = time.perf_counter()
            done = isinstance(ev, TurnFinished)
            with _immediate(self.db):
                self._insert(st)
                self.db.execute("UPDATE turns SET status = ?, answer = ?, error = ?, finished = ? "
                                "WHERE session_id = ? AND turn = ?",
                                ["complete" if done else "failed", ev.answer if done else None,
                                 None if done else ev.error, ev.t_wall, sid, ev.turn])
            st.turn = 0
            self.turn_ms.append((time.perf_counter() - t0) * 1000)

    def _session(self, ev: SessionStarted) -> None:
        from app.store.db import Store

        run = ev.run
        info = Store(self.db, self.path).process_info()
        with _immediate(self.db):
            exists = self.db.execute("SELECT 1 FROM sessions WHERE id = ?", [ev.session_id]).fetchone()
            if exists:  # a resumed session: this process writes it now
                self.db.execute("UPDATE sessions SET status = 'open', pid = ?, host = ? WHERE id = ?",
                                [info["pid"], info["host"], ev.session_id])
            else:
                self.db["sessions"].insert({
                    "id": ev.session_id, "created": ev.t_wall, "title": ev.title, "kind": self.kind,
                    "parent_id": ev.parent_id or None, "run_json": run.to_json(), "model": run.model,
                    "weight_format": run.weight_format, "kv_format": run.kv_format, "backend": run.backend,
                    "prefix_cache": int(run.prefix_cache), "prewarm": int(run.prewarm), "status": "open",
                    **info})
        self._resume(ev.session_id)

    def _resume(self, sid: str) -> _Open:
        seq = self.db.execute("SELECT coalesce(max(seq), -1) + 1 FROM messages WHERE session_id = ?", [sid]).fetchone()[0]
        st = self._open[sid] = _Open(seq=seq)
        return st

    def _insert(self, st: _Open) -> None:
        for table, rows in st.rows.items():
            if rows:
                self.db[table].insert_all(rows)
        st.rows = {}
        st.last_call = None

    def _write_idle(self) -> None:
        """Commit what lies outside a turn (turn 0) for every open session."""
        for st in self._open.values():
            if st.turn == 0 and any(st.rows.values()):
                with _immediate(self.db):
                    self._insert(st)

    def _end(self, sid: str) -> None:
        st = self._open.pop(sid, None)
        with _immediate(self.db):
            if st is not None:
                self._insert(st)  # a turn the consumer abandoned keeps its rows, marked below
                if st.turn:
                    self.db.execute("UPDATE turns SET status = 'incomplete', error = 'abandoned mid-turn' "
                                    "WHERE session_id = ? AND turn = ? AND status = 'running'", [sid, st.turn])
            self.db.execute("UPDATE sessions SET status = 'closed' WHERE id = ?", [sid])
