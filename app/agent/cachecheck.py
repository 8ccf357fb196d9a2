"""The prefix-break detector and the prompt lint.

Detector: every engine call of a session should extend the previous call's prompt + output
token for token; then a prefix cache can serve all of it but the last partial page. Before a
call, `PrefixDetector.check` compares the new ids with the previous call's ids + output (this
works without any cache: it is what the cache *could* serve, "reusable"); after the call,
`shortfall` compares that promise with the engine's cached_tokens.
A break names the first divergent token, the segment it falls in and a short text diff.

Lint: static checks of the prompt's prefix: a timestamp, date or UUID in the system prompt,
tool schemas not sorted by name, tool JSON that is not canonical (compact, sorted keys).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from app.agent.prompt import Segment

PAGE = 16


def floor_page(n: int, page: int = PAGE) -> int:
    return max(0, n) // page * page


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass(frozen=True)
class PrefixCheck:
    """What this call can reuse from the previous one (token comparison, no engine needed)."""

    prompt_tokens: int
    previous_tokens: int  # previous call's prompt + output (0 for the first call)
    common_tokens: int  # longest common prefix with it
    promised_tokens: int  # page-floored: what a cache should serve if nothing broke
    reusable_tokens: int  # page-floored common prefix: what a cache can serve
    broken: bool  # the new prompt does not extend the previous prompt + output
    segment: str | None = None  # where the divergence falls (in the new prompt)
    before: str = ""
    old: str = ""
    new: str = ""
    changed_segments: tuple[str, ...] = ()


def segment_at(segments: list[Segment], index: int) -> str:
    for s in segments:
        if s.start <= index < s.end:
            return s.name
    return segments[-1].name if segments else "?"


class PrefixDetector:
    """Per-session memory of the previous call. `check` does not mutate; `record` does."""

    def __init__(self, decode: Callable[[list[int]], str], page: int = PAGE, context: int = 12):
        self.decode = decode
        self.page = page
        self.context = context
        self.prev_ids: list[int] = []
        self.prev_cacheable = 0
        self.prev_segments: list[Segment] = []

    def check(self, ids: list[int], segments: list[Segment]) -> PrefixCheck:
        prev = self.prev_ids
        n = len(ids)
        if not prev:
            return PrefixCheck(n, 0, 0, 0, 0, False)
        lcp = common_prefix(prev, ids)
        limit = n - 1  # the engine computes at least the last prompt token
        promised = floor_page(min(self.prev_cacheable, limit), self.page)
        reusable = floor_page(min(lcp, self.prev_cacheable, limit), self.page)
        broken = lcp < len(prev) and lcp < n
        if not broken:
            return PrefixCheck(n, len(prev), lcp, promised, reusable, False)
        k = self.context
        old_names = {s.name: s.digest for s in self.prev_segments}
        changed = tuple(s.name for s in segments if s.name in old_names and old_names[s.name] != s.digest)
        return PrefixCheck(
            n, len(prev), lcp, promised, reusable, True,
            segment=segment_at(segments, lcp),
            before=self.decode(prev[max(0, lcp - k): lcp]),
            old=self.decode(prev[lcp: lcp + k]),
            new=self.decode(ids[lcp: lcp + k]),
            changed_segments=changed,
        )

    def record(self, ids: list[int], segments: list[Segment], output: list[int], finish_reason: str = "stop") -> None:
        """After a call: its prompt + output is what the next call should extend.

        A reply cut at max_tokens ("length") never ran its last token through the model, so the
        cache can hold one token less than prompt + output.
        """
        self.prev_ids = list(ids) + list(output)
        self.prev_cacheable = len(self.prev_ids) - (1 if finish_reason == "length" and output else 0)
        self.prev_segments = list(segments)

    def shortfall(self, check: PrefixCheck, stats) -> int | None:
        """Tokens the engine failed to serve although the prompt extended the previous one, or None
        when it served the promise (or the prompt broke the prefix: that is a PrefixBreak of its own)."""
        if check.broken:
            return None
        cached = stats.cached_tokens
        return check.promised_tokens - cached if cached < check.promised_tokens else None


# ---- lint --------------------------------------------------------------------------------
_DYNAMIC = [
    ("timestamp", re.compile(r"\b\d{4}-\d{2}-\d{2}[T ]\d{1,2}:\d{2}")),
    ("date", re.compile(r"\b\d{4}-\d{2}-\d{2}\b|\b\d{1,2}/\d{1,2}/\d{2,4}\b|\b(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]* \d{1,2},? \d{4}\b")),
    ("time of day", re.compile(r"\b\d{1,2}:\d{2}(?::\d{2})\b")),
    ("UUID", re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b")),
]


def lint_prompt(system_prompt: str, tools_text: str | None = None, schemas: list[dict] | None = None) -> list[str]:
    """Problems that would break prefix reuse between calls; [] when the prefix is canonical."""
    issues: list[str] = []
    seen = set()
    for kind, rx in _DYNAMIC:
        for m in rx.finditer(system_prompt):
            if (m.start(), kind) in seen or any(m.start() == s for s, _ in seen):
                continue
            seen.add((m.start(), kind))
            issues.append(f"system prompt contains a {kind} ({m.group(0)!r}): dynamic data belongs in the user message")
    if schemas is not None:
        names = [s.get("name", "") for s in schemas]
        if names != sorted(names):
            issues.append(f"tool schemas are not sorted by name ({', '.join(names)})")
    if tools_text is not None:
        start = tools_text.find("[")
        blob = tools_text[start:] if start >= 0 else tools_text
        try:
            parsed = orjson.loads(blob)
        except orjson.JSONDecodeError:
            issues.append("tool schemas are not valid JSON")
        else:
            canonical = orjson.dumps(parsed, option=orjson.OPT_SORT_KEYS).decode()
            if blob != canonical:
                issues.append("tool schemas are not canonical JSON (compact, sorted keys)")
            elif [t.get("name") for t in parsed] != sorted(t.get("name") for t in parsed):
                issues.append("tool schemas are not sorted by name")
    return issues
