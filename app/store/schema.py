"""The sessions database schema: append-only, numbered sqlite-utils Migrations.

Never edit an applied migration: add m00N_... below. tests/store checks a blank database
against the expected columns (columns_dict) and indexes, and that a database written by the
first schema upgrades cleanly.

Tables (one session = one conversation, or one replay of one):
- sessions      the RunConfig (JSON + the columns a list shows), parent_id of a replay, the writer's pid
- turns         one row per user turn; status running | complete | failed | incomplete (interrupted)
- messages      role, content, token span [start, end) and the exact token ids (int32 little-endian)
- tool_calls / tool_results   what the model called, and what came back (with its outcome)
- engine_calls  the whole ledger, one row per engine call, the pre-warm (kind "prewarm") included,
                with the pool snapshot taken after it
- cache_events  hit | insert | evict | pin | unpin per engine call
- telemetry     per engine call: temperature min / max / mean over zones, energy, power (when a source
                knows), the whole summary as JSON in `detail`
FTS5 over messages.content and tool_results.content.
"""

from __future__ import annotations

from sqlite_utils import Database
from sqlite_utils.migrations import Migrations

migrations = Migrations("kvdeck")

CALL_STATS = [
    ("prompt_tokens", "INTEGER"), ("cached_tokens", "INTEGER"), ("computed_tokens", "INTEGER"),
    ("new_tokens", "INTEGER"), ("waste_tokens", "INTEGER"), ("reuse", "REAL"), ("ttft_s", "REAL"),
    ("prefill_s", "REAL"), ("decode_s", "REAL"), ("decode_tokens", "INTEGER"), ("decode_tok_s", "REAL"),
    ("finish_reason", "TEXT"), ("weight_format", "TEXT"), ("kv_format", "TEXT"), ("backend", "TEXT"),
    ("threads", "INTEGER"), ("kv_used_pages", "INTEGER"), ("kv_pinned_pages", "INTEGER"),
    ("kv_free_pages", "INTEGER"), ("evicted_pages", "INTEGER"),
]


@migrations()
def m001_tables(db: Database) -> None:
    stats = ",\n    ".join(f"{name} {kind}" for name, kind in CALL_STATS)
    db.executescript(f"""
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    created REAL NOT NULL,
    title TEXT NOT NULL DEFAULT '',
    kind TEXT NOT NULL DEFAULT 'chat',
    parent_id TEXT REFERENCES sessions(id) ON DELETE SET NULL,
    run_json TEXT NOT NULL,
    model TEXT, weight_format TEXT, kv_format TEXT, backend TEXT,
    prefix_cache INTEGER, prewarm INTEGER,
    status TEXT NOT NULL DEFAULT 'open',
    pid INTEGER, host TEXT
);
CREATE TABLE turns (
    id INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    turn INTEGER NOT NULL,
    user_text TEXT NOT NULL,
    tool_choice TEXT NOT NULL,
    now TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL,
    answer TEXT, error TEXT,
    started REAL, finished REAL,
    UNIQUE (session_id, turn)
);
CREATE TABLE messages (
    id INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    turn INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    start INTEGER NOT NULL,
    "end" INTEGER NOT NULL,
    token_ids BLOB,
    t_wall REAL
);
CREATE TABLE tool_calls (
    id INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    turn INTEGER NOT NULL,
    call_id TEXT NOT NULL,
    name TEXT NOT NULL,
    arguments TEXT,
    raw TEXT,
    t_wall REAL
);
CREATE TABLE tool_results (
    id INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    turn INTEGER NOT NULL,
    call_id TEXT NOT NULL,
    name TEXT NOT NULL,
    ok INTEGER NOT NULL,
    content TEXT NOT NULL,
    elapsed_s REAL,
    outcome TEXT,
    t_wall REAL
);
CREATE TABLE engine_calls (
    id INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    turn INTEGER NOT NULL,
    call INTEGER NOT NULL,
    kind TEXT NOT NULL,
    tool_choice TEXT,
    reusable_tokens INTEGER,
    output_tokens INTEGER,
    {stats},
    kv_total_pages INTEGER, kv_block INTEGER, kv_bytes_per_token REAL,
    t_wall REAL
);
CREATE TABLE cache_events (
    id INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    turn INTEGER NOT NULL,
    call INTEGER NOT NULL,
    kind TEXT NOT NULL,
    engine_session INTEGER,
    pages INTEGER, tokens INTEGER, prefix_tokens INTEGER,
    head_text TEXT, reason TEXT,
    t_wall REAL
);
CREATE TABLE telemetry (
    id INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    turn INTEGER NOT NULL,
    call INTEGER NOT NULL,
    source TEXT,
    samples INTEGER,
    temp_min_c REAL, temp_max_c REAL, temp_mean_c REAL,
    energy_j REAL, power_mean_w REAL, peak_power_w REAL,
    throttled INTEGER,
    detail TEXT
);
""")


@migrations()
def m002_indexes_and_search(db: Database) -> None:
    for table in ("turns", "messages", "tool_calls", "tool_results", "engine_calls", "cache_events", "telemetry"):
        cols = ["session_id", "turn"] if table != "turns" else ["session_id", "status"]
        db[table].create_index(cols, index_name=f"idx_{table}_{'_'.join(cols)}", if_not_exists=True)
    db["sessions"].create_index(["created"], index_name="idx_sessions_created", if_not_exists=True)
    db["sessions"].create_index(["parent_id"], index_name="idx_sessions_parent_id", if_not_exists=True)
    db["messages"].enable_fts(["content"], fts_version="FTS5", create_triggers=True, tokenize="porter")
    db["tool_results"].enable_fts(["content"], fts_version="FTS5", create_triggers=True, tokenize="porter")


# engine_calls columns added by m003: the context budget of a call and what a trim cost
# (EngineCallFinished fields), and the cache events the native ring lost (CallStats).
CALL_CONTEXT = [
    ("context_budget", "INTEGER"), ("context_used", "INTEGER"), ("trimmed_tokens", "INTEGER"),
    ("trim_recomputed_tokens", "INTEGER"), ("events_dropped", "INTEGER"),
]


@migrations()
def m003_context_budget(db: Database) -> None:
    for name, kind in CALL_CONTEXT:
        db["engine_calls"].add_column(name, {"INTEGER": int, "REAL": float, "TEXT": str}[kind])
