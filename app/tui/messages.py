"""Messages between the workers and the UI (Textual `Message`s).

Facts are past tense (posted by a worker or a widget after something happened); commands are
imperative (a request to the app). Workers post from their own thread: `post_message` is
thread-safe; the handlers run on the UI thread, which alone mutates the ConsoleState.
"""

from __future__ import annotations

from textual.message import Message

# ---- facts --------------------------------------------------------------------------------


class EngineLoadProgressed(Message):
    """Model load / pre-warm advanced: a stage's name and a fraction (None: unknown)."""

    def __init__(self, stage: str, fraction: float | None) -> None:
        super().__init__()
        self.stage = stage
        self.fraction = fraction


class EngineLoaded(Message):
    """The engine and its agent are ready (the loaded.engine / loaded.agent handles)."""

    def __init__(self, loaded) -> None:
        super().__init__()
        self.loaded = loaded


class EngineLoadFailed(Message):
    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


class AgentEventReceived(Message):
    """One typed event of app.events (any but TokenDelta, which comes as TokensStreamed)."""

    def __init__(self, event) -> None:
        super().__init__()
        self.event = event


class TokensStreamed(Message):
    """Coalesced TokenDelta text of one engine call (at most one message per flush interval)."""

    def __init__(self, turn: int, call: int, text: str) -> None:
        super().__init__()
        self.turn = turn
        self.call = call
        self.text = text


class PoolSampled(Message):
    """engine.snapshot() (pool occupancy), engine.tree() and any cache events drained with them."""

    def __init__(self, snapshot: dict, cache_events: list | None = None, tree: list | None = None) -> None:
        super().__init__()
        self.snapshot = snapshot
        self.tree = tree
        self.cache_events = cache_events or []


class TurnEnded(Message):
    """The turn worker returned: `outcome` is finished | failed | cancelled."""

    def __init__(self, outcome: str, error: str = "") -> None:
        super().__init__()
        self.outcome = outcome
        self.error = error


class TelemetrySampled(Message):
    def __init__(self, sample) -> None:
        super().__init__()
        self.sample = sample


class ToolConfirmationRequested(Message):
    """The turn worker waits for the operator: `done(yes)` answers it (thread-safe)."""

    def __init__(self, name: str, arguments, done) -> None:
        super().__init__()
        self.name = name
        self.arguments = arguments
        self.done = done


# ---- commands -----------------------------------------------------------------------------


class SubmitPrompt(Message):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class CancelTurn(Message):
    pass


class ReloadEngine(Message):
    """Load the engine again with these ConsoleOptions (settings applied)."""

    def __init__(self, options) -> None:
        super().__init__()
        self.options = options
