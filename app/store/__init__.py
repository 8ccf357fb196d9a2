"""Sessions in SQLite: append-only migrations, a writer thread fed by the agent's events,
reading / search / export / import, and the inputs of a replay.

Consumes app.events and app.config only; wired in by app/__main__.py (the agent never imports it).
"""

from app.store.db import Store, StoreError, connect, new_id
from app.store.writer import StoreWriter

__all__ = ["Store", "StoreError", "StoreWriter", "connect", "new_id"]
