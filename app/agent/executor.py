"""Tool executors: who runs a tool call for the agent loop, and what happened to it.

    Executed = executor(turn, call_id, name, arguments)

- `ThreadExecutor` (the Agent's default): validates through the Toolkit and runs the function in
  a daemon thread bounded by the toolkit's timeout. A thread cannot be stopped: on a timeout the
  call is *abandoned* (outcome "timeout-abandoned"; the message tells the model so) and its side
  effects may still land.
- `ProcessExecutor`: the same contract, but the functions run in one worker process (spawned on
  first use, kept between calls). On a timeout the worker is killed, so the call stops with
  its side effects (outcome "timeout-killed"); the next call starts a fresh worker. Functions that
  cannot be imported by name in another process (closures, functions defined in a test) fall
  back to the thread path, and say so in the outcome.
- A replay passes its own executor that feeds back recorded results (app.store.replay).

Contracts: executors never raise for a tool's faults; `close()` stops any worker. One caller at a time.
"""

from __future__ import annotations

import importlib
import multiprocessing
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

from app.agent.toolkit import Toolkit, validate


@dataclass(frozen=True)
class Executed:
    ok: bool
    content: str  # what the model reads (the rendered result, or "error: ...")
    elapsed_s: float
    outcome: str  # ok | error | timeout-killed | timeout-abandoned | replayed | replay-missing


class ToolExecutor(Protocol):
    def __call__(self, turn: int, call_id: str, name: str, arguments: Any) -> Executed: ...

    def close(self) -> None: ...


def _checked(kit: Toolkit, name: str, arguments) -> str | None:
    """The error for an unknown tool or invalid arguments, or None."""
    tool = kit.tools.get(name)
    if tool is None:
        return f"unknown tool {name!r} (known: {', '.join(kit.tools)})"
    try:
        validate(arguments, tool.parameters)
    except ValueError as e:
        return f"invalid arguments for {name}: {e}"
    return None


class ThreadExecutor:
    """Runs tools in a daemon thread; a timed-out call is abandoned (recorded as such)."""

    def __init__(self, toolkit: Toolkit):
        self.kit = toolkit

    def __call__(self, turn: int, call_id: str, name: str, arguments) -> Executed:
        t0 = time.perf_counter()
        err = _checked(self.kit, name, arguments)
        if err:
            return Executed(False, f"error: {err}", time.perf_counter() - t0, "error")
        return _in_thread(self.kit, name, arguments, t0)

    def close(self) -> None:
        pass


def _in_thread(kit: Toolkit, name: str, arguments, t0: float) -> Executed:
    box: dict = {}
    fn = kit.tools[name].fn

    def work() -> None:
        try:
            box["value"] = fn(**arguments)
        except BaseException as e:  # the tool's fault goes back to the model
            box["error"] = e

    worker = threading.Thread(target=work, name=f"tool-{name}", daemon=True)
    worker.start()
    worker.join(kit.timeout_s)
    dt = time.perf_counter() - t0
    if worker.is_alive():
        return Executed(False, f"error: {name} timed out after {kit.timeout_s:g} s (the call was abandoned "
                               "and may still finish)", dt, "timeout-abandoned")
    if "error" in box:
        e = box["error"]
        return Executed(False, f"error: {name} raised {type(e).__name__}: {e}", dt, "error")
    return Executed(True, kit.render(box.get("value")), dt, "ok")


# ---- the worker process ---------------------------------------------------------------------
def _importable(fn) -> tuple[str, str] | None:
    """(module, qualname) when another process can import `fn` by name."""
    mod, qual = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not mod or mod in ("__main__", "__mp_main__") or "<" in qual:
        return None
    try:
        obj: Any = importlib.import_module(mod)
        for part in qual.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return None
    return (mod, qual) if obj is fn else None


def _worker_main(conn, setup) -> None:  # pragma: no cover - runs in the child
    if setup:
        mod, fn_name, kwargs = setup
        getattr(importlib.import_module(mod), fn_name)(**kwargs)
    conn.send(("ready",))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        mod, qual, arguments = msg
        try:
            obj: Any = importlib.import_module(mod)
            for part in qual.split("."):
                obj = getattr(obj, part)
            conn.send(("ok", obj(**arguments)))
        except BaseException as e:
            conn.send(("error", type(e).__name__, str(e)))


class ProcessExecutor:
    """Runs importable tools in a worker process that is killed on a timeout.

    `setup` = (module, function, kwargs) called once in each fresh worker, e.g.
    ("tools", "configure", {"workspace": ..., "notes_dir": ...}).
    """

    def __init__(self, toolkit: Toolkit, setup: tuple[str, str, dict] | None = None):
        self.kit = toolkit
        self.setup = setup
        self._ctx = multiprocessing.get_context("spawn")
        self._proc = None
        self._conn = None

    def _start(self) -> None:
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_worker_main, args=(child, self.setup), name="kvdeck-tools", daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent
        # Wait for its start-up (imports, setup) so a call's timeout counts the call alone.
        if not parent.poll(60) or parent.recv() != ("ready",):
            self._stop()
            raise OSError("the tool worker process did not start")

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(5)
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = None

    def __call__(self, turn: int, call_id: str, name: str, arguments) -> Executed:
        t0 = time.perf_counter()
        err = _checked(self.kit, name, arguments)
        if err:
            return Executed(False, f"error: {err}", time.perf_counter() - t0, "error")
        where = _importable(self.kit.tools[name].fn)
        if where is None:
            return _in_thread(self.kit, name, arguments, t0)
        try:
            if self._proc is None or not self._proc.is_alive():
                self._stop()
                self._start()
            self._conn.send((where[0], where[1], arguments))
            ready = self._conn.poll(self.kit.timeout_s)
            reply = self._conn.recv() if ready else None
        except (EOFError, OSError, BrokenPipeError) as e:
            self._stop()
            return Executed(False, f"error: {name}: the tool process died ({type(e).__name__})",
                            time.perf_counter() - t0, "error")
        dt = time.perf_counter() - t0
        if reply is None:
            self._stop()  # kill it: the call stops with its side effects
            return Executed(False, f"error: {name} timed out after {self.kit.timeout_s:g} s (the call was stopped)",
                            dt, "timeout-killed")
        if reply[0] == "error":
            return Executed(False, f"error: {name} raised {reply[1]}: {reply[2]}", dt, "error")
        return Executed(True, self.kit.render(reply[1]), dt, "ok")

    def close(self) -> None:
        self._stop()
