"""Synthetic agent events for store tests that need no engine (the event contract, app/events.py)."""

from __future__ import annotations

import dataclasses

from app.config import RunConfig
from app.engine.types import CallStats
from app.events import (CacheEvent, EngineCallFinished, KVSnapshot, MessageAdded, SessionStarted, ToolCalled,
                        ToolReturned, TurnFinished, TurnStarted)


def stats(prompt: int, cached: int, kind: str = "generate", decode: int = 4) -> CallStats:
    values = {f.name: 0 for f in dataclasses.fields(CallStats)}
    values |= dict(prompt_tokens=prompt, cached_tokens=cached, computed_tokens=prompt - cached, new_tokens=prompt - cached,
                   reuse=cached / prompt, ttft_s=0.01 * (prompt - cached) / 16, prefill_s=0.01, decode_s=0.02,
                   decode_tokens=decode, decode_tok_s=decode / 0.02, finish_reason="stop", weight_format="nvfp4",
                   kv_format="f32", backend="cpu", kv_used_pages=prompt // 16, kind=kind)
    return CallStats(**values)


def session_events(sid: str, turns: int, title: str = "synthetic"):
    """SessionStarted, the static prefix, a pre-warm call, then `turns` turns of user → tool → answer."""
    yield SessionStarted(RunConfig(tools=("search_notes",)), title, session_id=sid)
    yield MessageAdded(0, "system", "You are kvdeck.", 0, 4, (1, 2, 3, 4), session_id=sid)
    yield MessageAdded(0, "tools", "[search_notes]", 4, 8, (5, 6, 7, 8), session_id=sid)
    yield EngineCallFinished(0, 0, stats(8, 0, "prewarm", 0), 0, 0, "prewarm", session_id=sid)
    yield KVSnapshot(0, 0, 64, 1, 63, 1, 0, 0, 1, 2, 16, 18432.0, session_id=sid)
    pos, call = 8, 0
    for t in range(1, turns + 1):
        yield TurnStarted(t, f"question {t} about fan filters", "search_notes", f"2026-05-09T07:3{t % 10}:00+00:00",
                          session_id=sid)
        user = tuple(range(100 * t, 100 * t + 5))
        yield MessageAdded(t, "user", f"question {t} about fan filters", pos, pos + 5, user, session_id=sid)
        pos += 5
        for kind in ("call", "answer"):
            call += 1
            yield EngineCallFinished(t, call, stats(pos, pos // 16 * 16), pos // 16 * 16, 3, "auto", session_id=sid)
            yield CacheEvent(t, call, "hit", 1, pos // 16, pos // 16 * 16, 0, "You are", "", session_id=sid)
            yield KVSnapshot(t, call, 64, pos // 16 + 1, 63 - pos // 16, 1, 0, 0, pos // 16, 3, 16, 18432.0,
                             session_id=sid)
            yield MessageAdded(t, "assistant", f"{kind} {t}", pos, pos + 3, (7, 7, 7), session_id=sid)
            pos += 3
            if kind == "call":
                yield ToolCalled(t, f"call_{t}_1", "search_notes", {"query": "fan"}, "<tool_call>", session_id=sid)
                yield ToolReturned(t, f"call_{t}_1", "search_notes", True, f"notes: clean the fan filter ({t})", 0.01,
                                   "ok", session_id=sid)
                yield MessageAdded(t, "tool", f"notes: clean the fan filter ({t})", pos, pos + 4, (9, 9, 9, 9),
                                   session_id=sid)
                pos += 4
        yield TurnFinished(t, f"answer {t}", 2, 2, 1, session_id=sid)
