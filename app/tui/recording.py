"""A recorded console session: the agent's events and pool samples as JSON lines, and back.

Used for deterministic snapshot tests, README screenshots and `ConsoleState` replays without an
engine. One line per item:

    {"event": "EngineCallFinished", "fields": {..., "stats": {"__type__": "CallStats", ...}}}
    {"pool": {...snapshot...}, "tree": [...nodes...]}

Bad input raises ValueError naming the file, the line and the field.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import orjson

from app import events as E
from app.engine.types import CallStats
from app.tui.state import ConsoleState

_VALUE_TYPES = {"CallStats": CallStats}


def _value_types() -> dict:
    try:
        from app.config import RunConfig
    except ImportError:  # pragma: no cover - older config
        return _VALUE_TYPES
    return _VALUE_TYPES | {"RunConfig": RunConfig}


def _encode(v):
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {"__type__": type(v).__name__} | {f.name: _encode(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if isinstance(v, tuple):
        return [_encode(x) for x in v]
    return v


def encode_event(ev: E.Event) -> dict:
    return {"event": type(ev).__name__, "fields": {f.name: _encode(getattr(ev, f.name)) for f in dataclasses.fields(ev)}}


def _decode_value(v, where: str):
    if isinstance(v, dict) and "__type__" in v:
        cls = _value_types().get(v["__type__"])
        if cls is None:
            raise ValueError(f"{where}: unknown value type {v['__type__']!r}")
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: x for k, x in v.items() if k in known})
    return v


def decode_event(d: dict, where: str = "event") -> E.Event:
    name = d.get("event")
    cls = getattr(E, str(name), None)
    if not (isinstance(cls, type) and issubclass(cls, E.Event)):
        raise ValueError(f"{where}: unknown event {name!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kw = {}
    for k, v in (d.get("fields") or {}).items():
        if k not in fields:
            continue  # a field this version no longer has
        v = _decode_value(v, f"{where} field {k!r}")
        if isinstance(v, list) and "tuple" in str(fields[k].type):
            v = tuple(v)
        kw[k] = v
    try:
        return cls(**kw)
    except TypeError as e:
        raise ValueError(f"{where}: {name}: {e}") from None


def save(path: str | Path, items: list) -> None:
    """items: events, or ("pool", snapshot, tree) tuples, in the order they happened."""
    lines = []
    for it in items:
        if isinstance(it, E.Event):
            lines.append(encode_event(it))
        else:
            _, snap, tree = it
            lines.append({"pool": snap, "tree": tree})
    Path(path).write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))


def load(path: str | Path) -> list:
    out = []
    for i, line in enumerate(Path(path).read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{i}"
        try:
            d = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            raise ValueError(f"{where}: not JSON ({e})") from None
        if "pool" in d:
            out.append(("pool", d["pool"], d.get("tree") or []))
        else:
            out.append(decode_event(d, where))
    return out


def telemetry_of(items: list) -> list:
    """The recorded TelemetrySample events, oldest first."""
    cls = getattr(E, "TelemetrySample", None)
    return [it for it in items if cls is not None and isinstance(it, cls)]


def replay_into(state: ConsoleState, items: list) -> ConsoleState:
    """Fold recorded items into `state` (as the UI would have, token deltas included)."""
    for it in items:
        if isinstance(it, E.Event):
            state.apply(it)
        else:
            state.set_pool(it[1])
            state.tree = it[2]
    state.busy = False
    return state
