"""Tool executors: a timed-out tool in the worker process is stopped with its side effects; in a
thread it is abandoned (and says so); a normal call and a tool's exception come back as results."""

from __future__ import annotations

import time
from pathlib import Path

from app.agent import Toolkit
from app.agent.executor import ProcessExecutor, ThreadExecutor


def slow_write(path: str, delay: float) -> str:
    """Wait `delay` seconds, then write a file (a side effect).

    Args:
        path: the file to write
        delay: seconds to wait first
    """
    time.sleep(delay)
    Path(path).write_text("written")
    return "done"


def fails(x: int) -> int:
    """Always raises."""
    raise RuntimeError(f"kaput {x}")


def test_process_executor_kills_a_timed_out_tool_and_its_side_effect(tmp_path):
    exe = ProcessExecutor(Toolkit([slow_write, fails], timeout_s=0.5))
    try:
        ok = exe(1, "c1", "slow_write", {"path": str(tmp_path / "a"), "delay": 0.0})
        assert ok.ok and ok.outcome == "ok" and ok.content == "done" and (tmp_path / "a").exists()
        bad = exe(1, "c2", "fails", {"x": 3})
        assert not bad.ok and bad.outcome == "error" and "RuntimeError: kaput 3" in bad.content
        late = tmp_path / "late"
        t0 = time.perf_counter()
        out = exe(1, "c3", "slow_write", {"path": str(late), "delay": 1.5})
        assert time.perf_counter() - t0 < 1.2
        assert not out.ok and out.outcome == "timeout-killed" and "timed out after 0.5 s" in out.content
        time.sleep(1.6)
        assert not late.exists()  # the worker was killed: the write never happened
        again = exe(2, "c4", "slow_write", {"path": str(tmp_path / "b"), "delay": 0.0})  # a fresh worker
        assert again.ok and (tmp_path / "b").exists()
        assert exe(2, "c5", "nope", {}).outcome == "error"
    finally:
        exe.close()


def test_thread_executor_abandons_a_timed_out_tool_and_records_it(tmp_path):
    late = tmp_path / "late"
    out = ThreadExecutor(Toolkit([slow_write], timeout_s=0.2))(1, "c1", "slow_write", {"path": str(late), "delay": 0.6})
    assert not out.ok and out.outcome == "timeout-abandoned" and "abandoned" in out.content
    time.sleep(0.8)
    assert late.exists()  # why the CLI runs tools in a process: a thread cannot be stopped
