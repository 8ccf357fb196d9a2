"""`search_notes`: full-text search (SQLite FTS5, bm25) over the local knowledge base.

The knowledge base is a folder of Markdown notes (the first `# ` line is the title). The
index lives in the workspace (notes_index.sqlite) and is rebuilt when the folder's file
names, sizes or modification times change.
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
from typing import Annotated

from tools._env import notes_dir, workspace

_WORD = re.compile(r"[A-Za-z0-9_]{2,}")


def _signature(files) -> str:
    h = hashlib.sha256()
    for f in files:
        st = f.stat()
        h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns};".encode())
    return h.hexdigest()


def _open_index() -> sqlite3.Connection:
    files = sorted(notes_dir().glob("*.md"))
    db = sqlite3.connect(workspace() / "notes_index.sqlite")
    db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
    db.execute("CREATE VIRTUAL TABLE IF NOT EXISTS notes USING fts5(name UNINDEXED, title, body, tokenize='porter')")
    sig = _signature(files)
    row = db.execute("SELECT value FROM meta WHERE key = 'signature'").fetchone()
    if row is None or row[0] != sig:
        with db:
            db.execute("DELETE FROM notes")
            for f in files:
                text = f.read_text(errors="replace")
                first, _, rest = text.partition("\n")
                title = first[2:].strip() if first.startswith("# ") else f.stem
                db.execute("INSERT INTO notes (name, title, body) VALUES (?, ?, ?)", (f.name, title, rest.strip()))
            db.execute("INSERT OR REPLACE INTO meta VALUES ('signature', ?)", (sig,))
    return db


def search_notes(query: Annotated[str, {"maxLength": 120}], limit: Annotated[int, {"minimum": 1, "maximum": 5}] = 2) -> dict:
    """Search the local knowledge base of device-operations notes; returns the best matches.

    Args:
        query: words to look for, e.g. "thermal throttling fan"
        limit: how many notes to return (1 to 5)
    """
    words = _WORD.findall(query.lower())
    if not words:
        raise ValueError("the query has no searchable words")
    match = " OR ".join(f'"{w}"' for w in words[:12])
    limit = max(1, min(int(limit), 5))
    db = _open_index()
    try:
        rows = db.execute(
            "SELECT name, title, snippet(notes, 2, '', '', ' … ', 24) FROM notes WHERE notes MATCH ? "
            "ORDER BY bm25(notes, 0.0, 4.0, 1.0) LIMIT ?",
            (match, limit),
        ).fetchall()
    finally:
        db.close()
    return {"query": query, "results": [{"note": n, "title": t, "excerpt": s} for n, t, s in rows]}
