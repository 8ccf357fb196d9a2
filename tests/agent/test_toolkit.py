"""Toolkit schemas from typed functions, validation, guarded execution; the built-in tools. No engine."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Annotated, Literal, Optional

import orjson
import pytest

from app.agent.toolkit import ToolDefinitionError, Toolkit, tool_from_function


def set_fan(zone: Literal["cpu", "gpu"], speed: int, note: Annotated[str, {"maxLength": 40}] = "", dry_run: bool = True,
            tags: Optional[list[str]] = None) -> dict:
    """Set a fan's speed.

    Args:
        zone: which fan
        speed: percent, 0 to 100
        note: why
    """
    return {"zone": zone, "speed": speed}


def test_schema_from_typed_function():
    t = tool_from_function(set_fan)
    assert t.name == "set_fan" and t.description == "Set a fan's speed."
    p = t.parameters
    assert p["required"] == ["zone", "speed"] and p["additionalProperties"] is False
    assert p["properties"]["zone"] == {"type": "string", "enum": ["cpu", "gpu"], "description": "which fan"}
    assert p["properties"]["speed"] == {"type": "integer", "description": "percent, 0 to 100"}
    assert p["properties"]["note"] == {"type": "string", "maxLength": 40, "description": "why", "default": ""}
    assert p["properties"]["dry_run"] == {"type": "boolean", "default": True}
    assert p["properties"]["tags"]["type"] == "array" and "default" not in p["properties"]["tags"]


def test_toolkit_sorted_and_rejects_bad_functions():
    def zeta(x: int) -> int:
        """Z."""
        return x

    def alpha(x: int) -> int:
        """A."""
        return x

    assert Toolkit([zeta, alpha]).names == ["alpha", "zeta"]

    def untyped(x):
        """No annotation."""

    def undocumented(x: int):
        pass

    for fn in (untyped, undocumented):
        with pytest.raises(ToolDefinitionError):
            tool_from_function(fn)


def test_call_errors_are_results_not_exceptions():
    def boom(x: int) -> int:
        """Raises."""
        raise RuntimeError("kaput")

    def hang(x: int) -> int:
        """Hangs."""
        time.sleep(30)
        return x

    kit = Toolkit([set_fan, boom, hang], timeout_s=0.3)
    assert kit.call("set_fan", {"zone": "gpu", "speed": 50}).ok
    for name, args, expect in [
        ("nope", {}, "unknown tool 'nope'"),
        ("set_fan", {"zone": "disk", "speed": 1}, "not one of"),
        ("set_fan", {"zone": "cpu"}, "missing required speed"),
        ("set_fan", {"zone": "cpu", "speed": 1, "extra": 2}, "unknown extra"),
        ("set_fan", {"zone": "cpu", "speed": "fast"}, "expected integer"),
        ("boom", {"x": 1}, "RuntimeError: kaput"),
        ("hang", {"x": 1}, "timed out after 0.3 s"),
    ]:
        r = kit.call(name, args)
        assert not r.ok and expect in r.content, r.content
    assert kit.call("hang", {"x": 1}).elapsed_s < 2


def test_builtin_tools(tmp_path):
    import tools

    tools.configure(workspace=tmp_path, notes_dir=tools.notes_dir())
    kit = Toolkit(tools.builtin_tools())
    assert kit.names == sorted(kit.names) and len(kit.names) == 8
    r = kit.call("search_notes", {"query": "thermal throttling fan"})
    assert r.ok and "jetson-thermals.md" in r.content
    r = kit.call("device_status", {})
    assert r.ok and "memory" in orjson.loads(r.content)  # psutil; absent sensors are listed as unavailable
    assert orjson.loads(kit.call("calculate", {"expression": "(12.5 * 3) / 4 + 2**3"}).content)["value"] == 17.375
    assert kit.call("draft_email", {"to": "ops@example.com", "subject": "fan", "body": "clean it"}).ok
    assert kit.call("add_reminder", {"text": "check filter", "due": "Friday"}).ok
    assert "outbox.sqlite" in kit.call("list_files", {}).content
    (tmp_path / "log.txt").write_text("hello")
    assert "hello" in kit.call("read_file", {"path": "log.txt"}).content
    assert kit.call("now", {}).ok


@pytest.mark.parametrize("expr", ["__import__('os').system('true')", "open('x')", "x", "[1, 2]", "(1).real",
                                  "lambda: 1", "2 ** 10 ** 10", "'a' * 3"])
def test_calculate_refuses_non_arithmetic(expr):
    from tools import calculate

    with pytest.raises(ValueError):
        calculate(expr)


def test_file_tools_stay_in_workspace(tmp_path):
    import tools

    ws = tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "secret.txt").write_text("secret")
    (ws / "link").symlink_to(tmp_path / "secret.txt")
    (ws / "dirlink").symlink_to(tmp_path)
    tools.configure(workspace=ws)
    kit = Toolkit([tools.read_file, tools.list_files])
    for args in ({"path": "../secret.txt"}, {"path": str(tmp_path / "secret.txt")}, {"path": "link"},
                 {"path": "dirlink/secret.txt"}, {"path": "a/../../secret.txt"}, {"path": "~/x"}):
        r = kit.call("read_file", args)
        assert not r.ok and "PermissionError" in r.content, r.content
    assert not kit.call("list_files", {"path": ".."}).ok


def test_user_tools_folder(tmp_path):
    from app.agent.toolkit import load_tools_dir

    (tmp_path / "greet.py").write_text(
        'def greet(name: str) -> str:\n    """Say hello."""\n    return "hi " + name\n\ndef _private(): pass\n')
    kit = Toolkit(load_tools_dir(tmp_path))
    assert kit.names == ["greet"] and kit.call("greet", {"name": "ops"}).content == "hi ops"


def test_import_rules():
    """app.agent loads neither textual nor torch; tools never imports app."""
    code = ("import sys, app.agent, app.agent.tasks, app.events, tools; "
            "bad = [m for m in ('textual', 'torch', 'app.store', 'app.tui') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)
    code = "import sys, tools; bad = [m for m in sys.modules if m == 'app' or m.startswith('app.')]; assert not bad, bad"
    subprocess.run([sys.executable, "-c", code], check=True)
