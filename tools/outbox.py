"""`draft_email` / `add_reminder`: rows in an outbox table in the workspace. Nothing is sent."""

from __future__ import annotations

import sqlite3
from datetime import datetime
from typing import Annotated

from tools._env import workspace

_SCHEMA = """CREATE TABLE IF NOT EXISTS outbox (
  id INTEGER PRIMARY KEY, kind TEXT NOT NULL, recipient TEXT, subject TEXT, body TEXT,
  due TEXT, created TEXT NOT NULL)"""


def _insert(kind: str, **row) -> int:
    with sqlite3.connect(workspace() / "outbox.sqlite") as db:
        db.execute(_SCHEMA)
        cur = db.execute(
            "INSERT INTO outbox (kind, recipient, subject, body, due, created) VALUES (?, ?, ?, ?, ?, ?)",
            (kind, row.get("recipient"), row.get("subject"), row.get("body"), row.get("due"),
             datetime.now().astimezone().isoformat(timespec="seconds")),
        )
        return int(cur.lastrowid)


def draft_email(
    to: Annotated[str, {"maxLength": 80}],
    subject: Annotated[str, {"maxLength": 120}],
    body: Annotated[str, {"maxLength": 1200}],
) -> dict:
    """Draft an email into the local outbox for a person to review. It is never sent.

    Args:
        to: the recipient's address or name
        subject: the subject line
        body: the text of the email
    """
    return {"id": _insert("email", recipient=to, subject=subject, body=body), "status": "drafted, not sent"}


def add_reminder(text: Annotated[str, {"maxLength": 200}], due: Annotated[str, {"maxLength": 40}] = "") -> dict:
    """Add a reminder to the local outbox.

    Args:
        text: what to be reminded of
        due: when, e.g. "2026-05-10 09:00" or "tomorrow morning" (may be empty)
    """
    return {"id": _insert("reminder", body=text, due=due or None), "status": "saved"}
