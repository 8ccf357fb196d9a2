"""llama.cpp's CUDA backend as the peer of `kvdeck bench gpu`: its llama-bench figures.

The peer is built and run on the same GPU by ../shared/tools/llamacpp-peer (device_session.sh's
`peer` step: random-weight Llama-3-8B-shaped Q4_0, flash attention on, pp512 / tg128 at depth 0
and 4096); its `-o jsonl` lines come here through `kvdeck bench gpu --peer FILE`. Without a file
the ratios are against the figures that tool's README recorded on this H200 (2026-12-01).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

RECORDED_PP512 = 10634.0  # tok/s, 8B Q4_0, fa on (llamacpp-peer README, H200, 2026-12-01)
RECORDED_TG128 = 337.0    # tok/s, the same run


@dataclass(frozen=True)
class PeerFigures:
    pp512: float          # prompt tok/s, 512 tokens, depth 0
    tg128: float          # generation tok/s, depth 0
    tg128_4096: float | None  # generation tok/s after 4096 tokens (None where not run)
    source: str           # "measured in this run (FILE)" or "recorded"


def recorded() -> PeerFigures:
    return PeerFigures(RECORDED_PP512, RECORDED_TG128, None, "the llamacpp-peer README's figures (2026-12-01)")


def read_jsonl(path: Path) -> PeerFigures:
    """The flash-attention-on rows of llama-bench's JSON lines; raises ValueError naming the file
    and what is missing."""
    rows = []
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: line {i} is not JSON ({e.msg})") from None
    on = [r for r in rows if r.get("flash_attn") == 1 and "avg_ts" in r]  # 1 or true (older builds); -1 is auto

    def pick(n_prompt: int, n_gen: int, depth: int) -> float | None:
        for r in on:
            if int(r.get("n_prompt", -1)) == n_prompt and int(r.get("n_gen", -1)) == n_gen \
                    and int(r.get("n_depth", 0)) == depth:
                return float(r["avg_ts"])
        return None

    pp, tg = pick(512, 0, 0), pick(0, 128, 0)
    if pp is None or tg is None:
        raise ValueError(f"{path}: no flash-attention-on pp512 and tg128 rows at depth 0 "
                         f"({len(rows)} lines, {len(on)} with flash attention on)")
    return PeerFigures(pp, tg, pick(0, 128, 4096), f"measured in this run ({Path(path).name})")
