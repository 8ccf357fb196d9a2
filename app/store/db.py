"""The sessions database: open (migrate, WAL, foreign keys), read, search, delete.

    store = Store.open(path)          # applies pending migrations
    sid = store.resolve("3f9c")       # a unique prefix → the full id (git-style)
    store.session(sid)                # dict: session row + run + turns, messages, ledger, tools

Contracts
- One Store per thread (its connection is not shared); the StoreWriter has its own.
- Every connection: WAL, foreign_keys=ON, a 30 s busy timeout; writes use BEGIN IMMEDIATE.
- Opening a database marks turns left 'running' by a writer process that no longer exists
  as 'incomplete' (a crash or kill -9 mid-turn).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import sqlite3
from array import array
from collections.abc import Iterator
from pathlib import Path

from sqlite_utils import Database

from app.config import RunConfig
from app.store.schema import migrations


class StoreError(Exception):
    """A session cannot be found, is ambiguous, or a file cannot be imported. Names the id / file / field."""


TABLES = ("turns", "messages", "tool_calls", "tool_results", "engine_calls", "cache_events", "telemetry")


def connect(path: str | os.PathLike) -> Database:
    """A migrated sqlite-utils Database on `path` (created with its folder if missing)."""
    p = Path(path)
    if str(p) != ":memory:":
        p.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(str(p), timeout=30.0, check_same_thread=False)
    db = Database(conn)
    db.execute("PRAGMA foreign_keys = ON")
    if str(p) != ":memory:":
        db.enable_wal()
    db.execute("PRAGMA synchronous = NORMAL")  # WAL: a commit survives a process crash; fsync at checkpoints
    with _immediate(db):  # one process migrates at a time (each migration nests as a savepoint)
        migrations.apply(db)
    return db


@contextlib.contextmanager
def _immediate(db: Database) -> Iterator[Database]:
    """A write transaction taken up front (BEGIN IMMEDIATE), so two writers queue instead of deadlocking."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        db.rollback()
        raise
    else:
        db.execute("COMMIT")


def new_id() -> str:
    return secrets.token_hex(6)


def pack_ids(ids) -> bytes:
    return array("i", ids).tobytes()


def unpack_ids(blob: bytes | None) -> list[int]:
    a = array("i")
    if blob:
        a.frombytes(blob)
    return a.tolist()


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Store:
    def __init__(self, db: Database, path: str):
        self.db = db
        self.path = path

    @classmethod
    def open(cls, path: str | os.PathLike) -> Store:
        """Open (create, migrate) the database at `path`; StoreError when it is not one."""
        try:
            store = cls(connect(path), str(path))
        except (sqlite3.DatabaseError, OSError) as e:
            raise StoreError(f"{path}: cannot open the sessions database ({e})") from None
        store.mark_interrupted()
        return store

    def close(self) -> None:
        self.db.close()

    def tx(self):
        return _immediate(self.db)

    # ---- ids ----------------------------------------------------------------------------
    def resolve(self, prefix: str) -> str:
        """The one session id starting with `prefix` (StoreError when none or several)."""
        prefix = prefix.strip().lower()
        if not prefix or not all(c in "0123456789abcdef" for c in prefix):
            raise StoreError(f"{prefix!r} is not a session id (hex digits, as `kvdeck sessions list` shows)")
        rows = [r[0] for r in self.db.execute("SELECT id FROM sessions WHERE id LIKE ? ORDER BY id", [prefix + "%"])]
        if not rows:
            raise StoreError(f"no session {prefix!r} in {self.path}")
        if len(rows) > 1:
            raise StoreError(f"session id {prefix!r} is ambiguous: {', '.join(r[:10] for r in rows[:5])}…")
        return rows[0]

    def short(self, sid: str, min_len: int = 7) -> str:
        """The shortest unique prefix of `sid` (at least min_len characters)."""
        for n in range(min_len, len(sid)):
            if self.db.execute("SELECT count(*) FROM sessions WHERE id LIKE ?", [sid[:n] + "%"]).fetchone()[0] == 1:
                return sid[:n]
        return sid

    # ---- crash recovery -------------------------------------------------------------------
    def mark_interrupted(self) -> int:
        """Turns still 'running' whose writer process on this host is gone become 'incomplete'.
        (A writer on another host cannot be checked: its turns stay 'running'.)"""
        host = socket.gethostname()
        rows = self.db.execute(
            "SELECT DISTINCT s.id, s.pid, s.host FROM turns t JOIN sessions s ON s.id = t.session_id "
            "WHERE t.status = 'running'").fetchall()
        dead = [sid for sid, pid, h in rows if h == host and not _pid_alive(pid)]
        if not dead:
            return 0
        with self.tx():
            for sid in dead:
                self.db.execute("UPDATE turns SET status = 'incomplete', error = 'interrupted (the process ended mid-turn)' "
                                "WHERE session_id = ? AND status = 'running'", [sid])
                self.db.execute("UPDATE sessions SET status = 'closed' WHERE id = ?", [sid])
        return len(dead)

    # ---- reading --------------------------------------------------------------------------
    def list_sessions(self, limit: int = 50) -> list[dict]:
        return list(self.db.query(
            "SELECT s.*, (SELECT count(*) FROM turns t WHERE t.session_id = s.id) AS turns, "
            "(SELECT count(*) FROM engine_calls c WHERE c.session_id = s.id) AS calls, "
            "(SELECT group_concat(DISTINCT t.status) FROM turns t WHERE t.session_id = s.id) AS statuses "
            "FROM sessions s ORDER BY s.created DESC LIMIT ?", [limit]))

    def run_config(self, sid: str) -> RunConfig:
        row = self.db["sessions"].get(sid)
        return RunConfig.from_dict(json.loads(row["run_json"]))

    def rows(self, table: str, sid: str) -> list[dict]:
        order = {"turns": "turn", "messages": "seq", "engine_calls": "turn, call"}.get(table, "id")
        return list(self.db.query(f"SELECT * FROM {table} WHERE session_id = ? ORDER BY {order}, id", [sid]))

    def session(self, sid: str) -> dict:
        """Everything stored about one session (rows as dicts; token_ids as lists of int)."""
        d = {"session": dict(self.db["sessions"].get(sid))}
        for t in TABLES:
            d[t] = self.rows(t, sid)
        for m in d["messages"]:
            m["token_ids"] = unpack_ids(m["token_ids"])
        return d

    def conversation(self, sid: str) -> list[tuple[int, str, str, tuple[int, ...]]]:
        """(turn, role, content, ids) of the static prefix and every completed turn, in order (for resume)."""
        done = {r["turn"] for r in self.rows("turns", sid) if r["status"] == "complete"}
        return [(m["turn"], m["role"], m["content"], tuple(unpack_ids(m["token_ids"])))
                for m in self.rows("messages", sid) if m["turn"] == 0 or m["turn"] in done]

    def search(self, text: str, limit: int = 30) -> list[dict]:
        """FTS5 over messages and tool results: session, turn, role, a snippet; best first."""
        q = " ".join('"' + w.replace('"', '""') + '"' for w in text.split())
        if not q:
            return []
        sql = (
            "SELECT m.session_id, m.turn, m.role, snippet(messages_fts, 0, '[', ']', '…', 12) AS snippet, "
            "bm25(messages_fts) AS rank FROM messages_fts JOIN messages m ON m.rowid = messages_fts.rowid "
            "WHERE messages_fts MATCH ? AND m.role NOT IN ('system', 'tools') "
            "UNION ALL "
            "SELECT r.session_id, r.turn, 'tool:' || r.name, snippet(tool_results_fts, 0, '[', ']', '…', 12), "
            "bm25(tool_results_fts) FROM tool_results_fts JOIN tool_results r ON r.rowid = tool_results_fts.rowid "
            "WHERE tool_results_fts MATCH ? ORDER BY rank LIMIT ?")
        return list(self.db.query(sql, [q, q, limit]))

    def delete(self, sid: str) -> None:
        with self.tx():
            self.db.execute("DELETE FROM sessions WHERE id = ?", [sid])

    def process_info(self) -> dict:
        return {"pid": os.getpid(), "host": socket.gethostname()}
