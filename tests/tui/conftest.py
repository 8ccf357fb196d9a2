"""Fixtures of the console tests: the recorded session, a real engine (loaded once), UTC times."""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
import os
import time
from pathlib import Path

import pytest

os.environ["TZ"] = "UTC"  # the eviction log prints local times: snapshots need one zone
time.tzset()

DATA = Path(__file__).with_name("data")
SESSION = DATA / "session.jsonl"
WEIGHTS = Path(__file__).resolve().parents[2] / "models" / "weights" / "smollm2-135m"


@pytest.fixture(scope="session")
def recorded():
    from app.tui import recording

    return recording.load(SESSION)


@pytest.fixture(scope="session")
def shared_engine():
    """One engine for the Pilot tests (each test builds its own Agent on it)."""
    if not (WEIGHTS / ".done").exists():
        pytest.fail(f"the default model is missing ({WEIGHTS}); run `make model`")
    from app.__main__ import _console_builder
    from app.tui.services import ConsoleOptions

    args = argparse.Namespace(temperature=0.0, top_k=0, top_p=1.0, seed=0)
    eng, _ = _console_builder(args)(ConsoleOptions(), lambda *a: None)
    return eng


@pytest.fixture
def builder(shared_engine, tmp_path):
    """A Builder on the shared engine: a fresh Agent (its own engine session) per load, the
    built-in tools confined to a temporary workspace."""
    import tools
    from app.agent import Agent, AgentLimits, Toolkit

    agents = []

    def build(opts, progress):
        progress("building the agent", 0.5)
        tools.configure(workspace=str(tmp_path), notes_dir=None)
        fns = tools.builtin_tools() if opts.tools else []
        # A fixed clock: the user message carries the time, so the greedy replies repeat run to run.
        agent = Agent(shared_engine, Toolkit(fns), limits=AgentLimits(max_tokens=opts.max_tokens, follow_up="none"),
                      clock=lambda: datetime(2026, 5, 4, 9, 30, tzinfo=timezone.utc))
        agents.append(agent)
        return shared_engine, agent

    yield build
    for a in agents:
        getattr(a, "close", a.session.close)()


@pytest.fixture
def anyio_backend():
    return "asyncio"  # Pilot tests run on anyio's pytest plugin (installed with textual)
