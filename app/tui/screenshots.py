"""README screenshots of the console on a recorded session (SVG from Textual, PNG via cairosvg).

    .venv/bin/python -m app.tui.screenshots [--session tests/tui/data/session.jsonl] [--out assets/screenshots]

Writes main-160x48, main-80x24 (+ its Prompt, Pool and Engine tabs), inspector-120x36, help-80x24
and the light / 16-colour variants of the main screen as .png (cairosvg, `pip install cairosvg`;
without it the .svg stays).
The session is the recording tests/tui/record_session.py made on the real engine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

from app.tui import recording
from app.tui.app import KvdeckApp
from app.tui.state import ConsoleState

ROOT = Path(__file__).resolve().parents[2]
SESSION = ROOT / "tests" / "tui" / "data" / "session.jsonl"

# name, size, keys pressed first, theme
SHOTS = (
    ("main-160x48", (160, 48), (), None),
    ("main-80x24", (80, 24), (), None),
    ("main-80x24-prompt", (80, 24), ("f6",), None),
    ("main-80x24-pool", (80, 24), ("f7",), None),
    ("main-80x24-engine", (80, 24), ("f8",), None),
    ("inspector-120x36", (120, 36), ("f3", "down", "down"), None),
    ("help-80x24", (80, 24), ("f1",), None),
    ("main-120x36-light", (120, 36), (), "textual-light"),
    ("main-120x36-ansi", (120, 36), (), "ansi-dark"),
)


def recorded_app(session: Path = SESSION, theme: str | None = None) -> KvdeckApp:
    """The console without an engine, showing a recorded session (deterministic: no clock text)."""
    items = recording.load(session)
    state = recording.replay_into(ConsoleState(), items)
    tel = recording.telemetry_of(items)
    state.model = state.model or "smollm2-135m"
    tok = _tokenizer()
    if tok is not None:
        state.decode = lambda ids: tok.decode(list(ids), skip_special_tokens=False)
    return KvdeckApp(None, state=state, sampler=(lambda: tel[-1]) if tel else None, theme=theme,
                     telemetry_s=3600.0, history=tel)


def _tokenizer():
    """The default model's tokenizer (the recording's token ids are SmolLM2's), or None."""
    try:
        from app.engine.loader import read_tokenizer, resolve_model_dir

        return read_tokenizer(resolve_model_dir("smollm2-135m", "nvfp4"))
    except Exception:  # no model folder: the inspector shows ids instead of text
        return None


async def _shoot(out: Path, session: Path, name: str, size, keys, theme) -> Path:
    app = recorded_app(session, theme)
    async with app.run_test(size=size) as pilot:
        await pilot.pause(0.3)
        for k in keys:
            await pilot.press(k)
            await pilot.pause(0.2)
        await pilot.pause(0.3)
        path = out / f"{name}.svg"
        app.save_screenshot(str(path.name), path=str(out))
    return path


def to_png(svg: Path) -> Path | None:
    try:
        import cairosvg
    except ImportError:
        return None
    png = svg.with_suffix(".png")
    cairosvg.svg2png(url=str(svg), write_to=str(png))
    return png


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m app.tui.screenshots")
    p.add_argument("--session", type=Path, default=SESSION)
    p.add_argument("--out", type=Path, default=ROOT / "assets" / "screenshots")
    p.add_argument("--only", help="one shot's name")
    p.add_argument("--keep-svg", action="store_true", help="keep the SVGs next to the PNGs")
    args = p.parse_args(argv)
    os.environ.setdefault("TZ", "UTC")
    time.tzset()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, size, keys, theme in SHOTS:
        if args.only and name != args.only:
            continue
        svg = asyncio.run(_shoot(args.out, args.session, name, size, keys, theme))
        png = to_png(svg)
        if png is not None and not args.keep_svg:
            svg.unlink()
        print(png or f"{svg} (no cairosvg: SVG only)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
