"""The console stores its session (the composition root's builder + app.store) and the sessions
screen lists, searches, opens, compares and deletes stored sessions."""

from __future__ import annotations

import argparse

import pytest

from app.tui.app import KvdeckApp
from app.tui.services import ConsoleOptions
from tui_helpers import shown, wait_for


@pytest.mark.anyio
async def test_console_session_is_stored_and_listed(tmp_path):
    from app.__main__ import _console_builder
    from app.store import Store, StoreWriter

    db = tmp_path / "sessions.db"
    writer = StoreWriter(db, kind="console")
    store = Store.open(db)
    args = argparse.Namespace(temperature=0.0, top_k=0, top_p=1.0, seed=0)
    app = KvdeckApp(_console_builder(args, writer), ConsoleOptions(max_tokens=6, tool_choice="none"),
                    sampler=None, store=store)
    try:
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for(pilot, lambda: app.loaded is not None, timeout=120)
            app.screen.query_one("#prompt-input").value = "Name a colour."
            await pilot.click("#prompt-input")
            await pilot.press("enter")
            await wait_for(pilot, lambda: not app.state.busy and len(app.state.calls) == 2, timeout=120)
            assert writer.flush()
            await pilot.press("f2")
            await pilot.pause(0.5)
            screen = app.screen
            assert type(screen).__name__ == "SessionsScreen"
            table = screen.query_one("#list")
            assert table.row_count == 1
            sid = app.loaded.agent.session_id
            assert table.get_row_at(0)[0] == store.short(sid)
            assert table.get_row_at(0)[4] == "2", "the pre-warm and the turn's call are stored"
            detail = shown(screen.query_one("#sessiontext"))
            assert "2 engine calls" in detail and "Name a colour." in detail
            screen.query_one("#search").value = "colour"
            screen.query_one("#search").focus()
            await pilot.press("enter")
            await pilot.pause(0.3)
            assert table.row_count == 1 and "colour" in table.get_row_at(0)[2]
            screen.query_one("#search").value = "zebra"
            screen.query_one("#search").focus()
            await pilot.press("enter")
            await pilot.pause(0.3)
            assert table.row_count == 0
            screen.query_one("#search").value = ""
            screen.query_one("#search").focus()
            await pilot.press("enter")
            await pilot.pause(0.3)
            await pilot.press("d")
            assert table.row_count == 1, "one d only arms the delete"
            await pilot.press("d")
            await pilot.pause(0.3)
            assert table.row_count == 0 and store.list_sessions() == []
    finally:
        writer.close()
        store.close()
