"""The Textual console: the only package that imports textual.

    run_console(builder, options)   open the console (the composition root passes `builder`)

Nothing outside app/tui and app/__main__ imports this package.
"""

from __future__ import annotations

from app.tui.services import Builder, ConsoleOptions, Loaded, SessionHooks


def run_console(builder: Builder | None, options: ConsoleOptions = ConsoleOptions(), **kw) -> int:
    from app.tui.app import KvdeckApp

    KvdeckApp(builder, options, **kw).run()
    return 0


__all__ = ["Builder", "ConsoleOptions", "Loaded", "SessionHooks", "run_console"]
