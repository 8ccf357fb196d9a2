"""The one exception type of the offline model pipeline.

Contract: every failure that a user can cause or fix (a missing or damaged file, an unsupported
model, a hash mismatch, an unknown format name) is raised as :class:`ModelError`, whose message
names the file (or model, or format) and says what is wrong. ``models.cli.main`` turns it into
``kvdeck: error: <message>`` on stderr and exit status 2; anything else is a bug.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["ModelError", "require_file"]


class ModelError(Exception):
    """A user-facing pipeline failure; ``str(err)`` is a complete, self-contained sentence."""


def require_file(path: str | Path, what: str = "file") -> Path:
    """Return ``path`` as a Path if it is an existing regular file, else raise ModelError.

    ``what`` describes the file's role (e.g. "tokenizer", "GGUF model") for the message.
    """
    p = Path(path)
    if not p.exists():
        raise ModelError(f"{p}: missing {what} (no such file)")
    if not p.is_file():
        raise ModelError(f"{p}: expected a {what}, found a directory or special file")
    return p
