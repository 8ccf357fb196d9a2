"""`read_file` / `list_files`: confined to the workspace folder.

Refused: absolute paths, any `..` component, and anything whose resolved path (symlinks
followed) lies outside the workspace.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Annotated

from tools._env import workspace


def _inside(path: str) -> Path:
    p = PurePosixPath(path.strip() or ".")
    if p.is_absolute() or path.startswith("~"):
        raise PermissionError(f"{path!r}: absolute paths are refused; give a path inside the workspace")
    if ".." in p.parts:
        raise PermissionError(f"{path!r}: '..' is refused; paths stay inside the workspace")
    root = workspace().resolve()
    full = (root / p).resolve()
    if full != root and root not in full.parents:
        raise PermissionError(f"{path!r}: leads outside the workspace (symlink)")
    return full


def read_file(path: Annotated[str, {"maxLength": 200}], max_chars: Annotated[int, {"minimum": 1, "maximum": 20000}] = 2000) -> dict:
    """Read a text file from the workspace folder.

    Args:
        path: a path relative to the workspace, e.g. "logs/today.txt"
        max_chars: return at most this many characters
    """
    f = _inside(path)
    if not f.is_file():
        raise FileNotFoundError(f"{path!r}: no such file in the workspace")
    text = f.read_text(errors="replace")
    n = max(0, min(max_chars, 20000))
    return {"path": path, "chars": len(text), "text": text[:n], "truncated": len(text) > n}


def list_files(path: Annotated[str, {"maxLength": 200}] = ".") -> dict:
    """List the files and folders in a workspace folder.

    Args:
        path: a folder relative to the workspace ("." for its root)
    """
    d = _inside(path)
    if not d.is_dir():
        raise NotADirectoryError(f"{path!r}: not a folder in the workspace")
    entries = sorted(d.iterdir())[:200]
    return {"path": path, "entries": [e.name + ("/" if e.is_dir() else "") for e in entries]}
