"""Record the console's demo session (tests/tui/data/session.jsonl) on the real engine.

    .venv/bin/python tests/tui/record_session.py

Three turns on SmolLM2-135M (nvfp4 weights, f32 KV, a 156-page pool so that the third turn
evicts): a tool call, a follow-up, then the system prompt gains a timestamp (the classic cache
killer) so the prefix-break detector fires. Greedy decoding: the token figures are the engine's;
the times are whatever this machine measured when it was recorded.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app.__main__ import _console_builder  # noqa: E402
from app.tui import recording  # noqa: E402
from app.tui.services import ConsoleOptions  # noqa: E402

OUT = Path(__file__).with_name("data") / "session.jsonl"
TURNS = (("What is 17 * 23?", "calculate"), ("Thanks. Say it in one sentence.", "none"),
         ("What time is it on this device?", "none"))


def main() -> int:
    from app.telemetry import Sampler, to_event

    tel = Sampler(interval=0.5).start()
    args = argparse.Namespace(temperature=0.0, top_k=0, top_p=1.0, seed=0)
    eng, agent = _console_builder(args)(ConsoleOptions(kv_pages=156, max_tokens=24), lambda *a: None)
    items: list = list(agent.prewarm())
    items.append(("pool", eng.snapshot(), eng.tree()))
    for i, (text, choice) in enumerate(TURNS):
        if i == 2:
            agent.system_timestamp = True  # the cache killer: the system prompt changes every call
        for ev in agent.run_turn(text, choice):
            items.append(ev)
            print(type(ev).__name__, str(ev)[:140])
        items.append(("pool", eng.snapshot(), eng.tree()))
    tel.stop()
    items += [to_event(s) for s in tel.history.raw()[-30:]]
    recording.save(OUT, items)
    print(f"wrote {len(items)} items to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
