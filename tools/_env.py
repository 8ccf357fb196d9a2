"""Where the tools may read and write: the workspace folder and the notes folder.

Set once by the composition root (`configure`); tests point them at temporary folders.
Defaults: $KVDECK_WORKSPACE or ./workspace, and the shipped demo notes in assets/notes.
"""

from __future__ import annotations

import os
from pathlib import Path

_REPO = Path(__file__).resolve().parents[1]
_state: dict[str, Path] = {}


def configure(workspace: str | os.PathLike | None = None, notes_dir: str | os.PathLike | None = None) -> None:
    """Point the tools at a workspace folder (created if missing) and a notes folder."""
    if workspace is not None:
        _state["workspace"] = Path(workspace).expanduser()
    if notes_dir is not None:
        _state["notes"] = Path(notes_dir).expanduser()


def workspace() -> Path:
    """The workspace root, created on first use. File tools never leave it."""
    p = _state.get("workspace") or Path(os.environ.get("KVDECK_WORKSPACE", "workspace"))
    p.mkdir(parents=True, exist_ok=True)
    return p


def notes_dir() -> Path:
    return _state.get("notes") or _REPO / "assets" / "notes"
