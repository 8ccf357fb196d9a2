"""Export a stored session (JSON: the whole record; Markdown: the transcript and its ledger) and
import a JSON export back (validated first: a malformed file is a StoreError naming the file,
table, row and field, and nothing is imported).

The JSON format:
    {"format": "kvdeck-session", "version": 1, "session": {...}, "turns": [...], "messages": [...],
     "tool_calls": [...], "tool_results": [...], "engine_calls": [...], "cache_events": [...],
     "telemetry": [...]}
Rows are the tables' columns without `id` and `session_id`; messages carry token_ids as a list.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from app.config import ConfigError, RunConfig
from app.store.db import TABLES, Store, StoreError, pack_ids

FORMAT, VERSION = "kvdeck-session", 1
SESSION_KEYS = ("id", "created", "title", "kind", "parent_id", "run_json")
_INTS = {"turn", "call", "seq", "start", "end", "ok"}
_REQUIRED = {
    "turns": ("turn", "user_text", "tool_choice", "status"),
    "messages": ("turn", "seq", "role", "content", "start", "end"),
    "tool_calls": ("turn", "call_id", "name"),
    "tool_results": ("turn", "call_id", "name", "ok", "content"),
    "engine_calls": ("turn", "call", "kind"),
    "cache_events": ("turn", "call", "kind"),
    "telemetry": ("turn", "call"),
}


# ---- export ---------------------------------------------------------------------------------
def export_dict(store: Store, sid: str) -> dict:
    d = store.session(sid)
    s = d["session"]
    out = {"format": FORMAT, "version": VERSION,
           "session": {k: s[k] for k in SESSION_KEYS} | {"run": json.loads(s["run_json"])}}
    del out["session"]["run_json"]
    for t in TABLES:
        out[t] = [{k: v for k, v in r.items() if k not in ("id", "session_id")} for r in d[t]]
    return out


def export_json(store: Store, sid: str) -> str:
    return json.dumps(export_dict(store, sid), indent=1, sort_keys=True)


def export_markdown(store: Store, sid: str) -> str:
    d = store.session(sid)
    s, run = d["session"], store.run_config(sid)
    lines = [f"# kvdeck session {sid}" + (f" — {s['title']}" if s["title"] else ""), "",
             f"{run.model} · {run.weight_format} weights · {run.kv_format} KV · {run.backend} · "
             f"prefix cache {'on' if run.prefix_cache else 'off'} · pre-warm {'on' if run.prewarm else 'off'}"
             + (f" · replay of {s['parent_id']}" if s["parent_id"] else ""), ""]
    calls = {r["call_id"]: r for r in d["tool_calls"]}
    for t in d["turns"]:
        lines += [f"## Turn {t['turn']} ({t['status']})", "", f"**user** ({t['tool_choice']}): {t['user_text']}", ""]
        for r in (r for r in d["tool_results"] if r["turn"] == t["turn"]):
            c = calls.get(r["call_id"], {})
            lines += [f"- tool `{r['name']}` {c.get('arguments', '')} → {'ok' if r['ok'] else r['outcome'] or 'error'}: "
                      f"{r['content'][:300]}"]
        if t["answer"] is not None:
            lines += ["", f"**assistant**: {t['answer']}"]
        if t["error"]:
            lines += ["", f"*{t['error']}*"]
        lines.append("")
    lines += ["## Ledger", "", "| turn | call | kind | prompt | cached | computed | reuse | ttft s | decode tok/s | finish |",
              "|---:|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    for c in d["engine_calls"]:
        lines.append(f"| {c['turn']} | {c['call']} | {c['kind']} | {c['prompt_tokens']} | {c['cached_tokens']} | "
                     f"{c['computed_tokens']} | {(c['reuse'] or 0):.1%} | {(c['ttft_s'] or 0):.3f} | "
                     f"{(c['decode_tok_s'] or 0):.1f} | {c['finish_reason']} |")
    return "\n".join(lines) + "\n"


# ---- import ---------------------------------------------------------------------------------
def _fail(src: str, where: str, msg: str):
    raise StoreError(f"{src}: {where}: {msg}; nothing was imported")


def validate(data, src: str, columns: dict[str, set[str]]) -> None:
    """Raise StoreError naming the first problem of an export dict."""
    if not isinstance(data, dict):
        _fail(src, "top level", f"expected a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        _fail(src, "format", f"expected {FORMAT!r}, got {data.get('format')!r} (not a kvdeck session export)")
    if data.get("version") != VERSION:
        _fail(src, "version", f"this kvdeck reads version {VERSION}, got {data.get('version')!r}")
    s = data.get("session")
    if not isinstance(s, dict):
        _fail(src, "session", "missing or not an object")
    sid = s.get("id")
    if not isinstance(sid, str) or len(sid) < 6 or not all(c in "0123456789abcdef" for c in sid):
        _fail(src, "session.id", f"{sid!r} is not a session id (6+ hex digits)")
    if not isinstance(s.get("created"), (int, float)):
        _fail(src, "session.created", f"expected a number, got {s.get('created')!r}")
    try:
        RunConfig.from_dict(s.get("run"))
    except (ConfigError, TypeError, ValueError) as e:
        _fail(src, "session.run", str(e))
    for table in TABLES:
        rows = data.get(table, [])
        if not isinstance(rows, list):
            _fail(src, table, f"expected a list, got {type(rows).__name__}")
        allowed = columns[table] - {"id", "session_id"}
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                _fail(src, f"{table}[{i}]", "expected an object")
            extra = sorted(set(row) - allowed)
            if extra:
                _fail(src, f"{table}[{i}]", f"unknown field {', '.join(extra)}")
            for key in _REQUIRED[table]:
                if row.get(key) is None:
                    _fail(src, f"{table}[{i}].{key}", "missing")
            for key in _INTS & set(row):
                if row[key] is not None and (not isinstance(row[key], int) or isinstance(row[key], bool)):
                    _fail(src, f"{table}[{i}].{key}", f"expected an integer, got {row[key]!r}")
            if table == "messages":
                ids = row.get("token_ids", [])
                if not isinstance(ids, list) or not all(isinstance(t, int) and 0 <= t < 2**31 for t in ids):
                    _fail(src, f"messages[{i}].token_ids", "expected a list of token ids")
                if len(ids) != row["end"] - row["start"]:
                    _fail(src, f"messages[{i}].token_ids", f"{len(ids)} ids for the span [{row['start']}, {row['end']})")


def import_file(store: Store, path: str | Path) -> str:
    """Import a JSON export; returns the session id. StoreError (nothing imported) when the file is
    unreadable, malformed, or the session is already in the database."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise StoreError(f"{p}: file not found") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise StoreError(f"{p}: not valid JSON ({e}); nothing was imported") from None
    return import_dict(store, data, str(p))


def import_dict(store: Store, data, src: str = "<export>") -> str:
    db = store.db
    columns = {t: set(db[t].columns_dict) for t in TABLES}
    validate(data, src, columns)
    s = data["session"]
    sid = s["id"]
    if db.execute("SELECT 1 FROM sessions WHERE id = ?", [sid]).fetchone():
        raise StoreError(f"{src}: session {sid} is already in {store.path}; nothing was imported")
    run = RunConfig.from_dict(s["run"])
    parent = s.get("parent_id")
    if parent and not db.execute("SELECT 1 FROM sessions WHERE id = ?", [parent]).fetchone():
        parent = None  # its source is not in this database
    try:
        _insert(store, data, sid, run, parent)
    except sqlite3.Error as e:  # e.g. two turns with one number: the transaction rolled back
        raise StoreError(f"{src}: {e}; nothing was imported") from None
    return sid


def _insert(store: Store, data: dict, sid: str, run: RunConfig, parent: str | None) -> None:
    db, s = store.db, data["session"]
    with store.tx():
        db["sessions"].insert({"id": sid, "created": s["created"], "title": s.get("title") or "",
                               "kind": s.get("kind") or "import", "parent_id": parent, "run_json": run.to_json(),
                               "model": run.model, "weight_format": run.weight_format, "kv_format": run.kv_format,
                               "backend": run.backend, "prefix_cache": int(run.prefix_cache),
                               "prewarm": int(run.prewarm), "status": "closed", "pid": None, "host": None})
        for table in TABLES:
            rows = [dict(r, session_id=sid) for r in data.get(table, [])]
            if table == "messages":
                for r in rows:
                    r["token_ids"] = pack_ids(r.get("token_ids", []))
            if table == "turns":
                for r in rows:
                    if r["status"] == "running":  # its writer is not here: it ended mid-turn
                        r["status"] = "incomplete"
            if rows:
                db[table].insert_all(rows)
