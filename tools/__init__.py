"""The agent's tools: plain typed Python functions; each docstring is the tool's description.

This package never imports `app`. The command line (app/__main__.py) calls
`configure(workspace=..., notes_dir=...)` once, then hands `builtin_tools()` to the agent's
toolkit, which turns each function's signature and docstring into a JSON schema.

A string parameter may carry schema hints with `Annotated[str, {"maxLength": 2000}]`.
"""

from __future__ import annotations

from tools._env import configure, notes_dir, workspace
from tools.calc import calculate
from tools.clock import now
from tools.device import device_status
from tools.files import list_files, read_file
from tools.notes import search_notes
from tools.outbox import add_reminder, draft_email


def builtin_tools() -> list:
    """The built-in tools, in no particular order (the toolkit sorts them by name)."""
    return [search_notes, device_status, calculate, draft_email, add_reminder, read_file, list_files, now]


__all__ = [
    "add_reminder",
    "builtin_tools",
    "calculate",
    "configure",
    "device_status",
    "draft_email",
    "list_files",
    "notes_dir",
    "now",
    "read_file",
    "search_notes",
    "workspace",
]
