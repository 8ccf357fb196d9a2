"""Settings: frozen dataclasses, one loader (TOML file, then command-line flags).

The file is $KVDECK_CONFIG or ~/.config/kvdeck/config.toml when it exists:

    [engine]
    model = "smollm2-135m"    # a name under the models folder, or a path
    weights = "nvfp4"         # nvfp4 | w4a8 | f16 | f32
    kv = "f32"                # f32 | f16 | nvfp4 | nvfp4r | k8v4 | kpc4 (docs/ENGINE.md, KV formats)
    threads = 0               # 0: all cores
    device = "cpu"            # cpu | cuda (a build with the CUDA backend, on a machine with a GPU)
    activations = "auto"      # auto | a8 | a16: activations of the integer matmuls; auto = a16 for gguf
                              # weights on the CPU (top-1 0.999 vs f32 instead of 0.961), a8 otherwise
    max_context = 0           # KV pool sizing in tokens; 0: the model's context (one whole session)
    kv_mib = 512.0            # KV memory budget (MiB): the pool is the smaller of max_context and this; 0: none

    [agent]
    tools_dir = ""            # a folder of .py files whose public typed functions become tools
    workspace = "workspace"   # the file / outbox tools stay inside this folder
    notes_dir = ""            # the knowledge base for search_notes ("" = the shipped demo notes)
    max_steps = 4             # engine calls per user turn
    tool_timeout_s = 10.0     # a tool call running longer returns a timeout error to the model
    max_tokens = 200          # tokens per free reply
    follow_up = "none"        # tool_choice after a tool result: "none" answers from it (the 135M default
                              # model loops on "auto"); "auto" lets a larger model chain tools
    trim_low_water = 0.6      # when a call would not fit the context budget, drop whole oldest turns down
                              # to this fraction of it (system prompt, tools and the current turn stay)
    context_tokens = 0        # a cap on the context budget in tokens (0: the model's context and the pool)
    trim_ahead = true         # after a turn, make the trim the next turn would need and compute the kept
                              # history while you type (its own ledger row, kind "trim")

    [store]
    path = ""                 # the sessions database ("" = kvdeck.db in the user data folder)
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclass(frozen=True)
class EngineSettings:
    model: str = "smollm2-135m"
    weights: str = "nvfp4"
    kv: str = "f32"
    threads: int = 0
    device: str = "cpu"  # the engine's backend: cpu | cuda
    activations: str = "auto"  # auto | a8 | a16 (app/engine/loader.py ACTIVATIONS)
    max_context: int = 0  # KV pool in tokens; 0: the model's context
    kv_mib: float = 512.0  # KV memory budget; the pool is the smaller of the two (0: no budget)


@dataclass(frozen=True)
class AgentSettings:
    tools_dir: str = ""
    workspace: str = "workspace"
    notes_dir: str = ""
    max_steps: int = 4
    tool_timeout_s: float = 10.0
    max_tokens: int = 200
    follow_up: str = "none"
    trim_low_water: float = 0.6  # a trim cuts the prompt to this fraction of the context budget
    context_tokens: int = 0  # cap on the context budget (0: none)
    trim_ahead: bool = True  # trim after a turn when the next one is expected not to fit (Agent.trim_ahead)


@dataclass(frozen=True)
class StoreSettings:
    path: str = ""  # "" = default_db_path()


@dataclass(frozen=True)
class Settings:
    engine: EngineSettings = EngineSettings()
    agent: AgentSettings = AgentSettings()
    store: StoreSettings = StoreSettings()


class ConfigError(Exception):
    pass


def config_path() -> Path:
    env = os.environ.get("KVDECK_CONFIG")
    return Path(env) if env else Path.home() / ".config" / "kvdeck" / "config.toml"


def load_settings(path: Path | None = None, **overrides) -> Settings:
    """Read the TOML file (if any), then apply non-None keyword overrides to [engine]."""
    path = path or config_path()
    engine = EngineSettings()
    agent = AgentSettings()
    store = StoreSettings()
    if path.is_file():
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: invalid TOML ({e})") from None
        section = data.get("engine", {})
        known = {f.name: f.type for f in fields(EngineSettings)}
        for key, value in section.items():
            if key not in known:
                raise ConfigError(f"{path}: [engine] has unknown field '{key}' (known: {', '.join(known)})")
        engine = replace(engine, **section)
        section = data.get("agent", {})
        known = {f.name for f in fields(AgentSettings)}
        for key in section:
            if key not in known:
                raise ConfigError(f"{path}: [agent] has unknown field '{key}' (known: {', '.join(known)})")
        agent = replace(agent, **section)
        if not isinstance(agent.trim_ahead, bool):
            raise ConfigError(f"{path}: [agent] trim_ahead must be true or false, got {agent.trim_ahead!r}")
        section = data.get("store", {})
        known = {f.name for f in fields(StoreSettings)}
        for key in section:
            if key not in known:
                raise ConfigError(f"{path}: [store] has unknown field '{key}' (known: {', '.join(known)})")
        store = replace(store, **section)
    engine = replace(engine, **{k: v for k, v in overrides.items() if v is not None})
    return Settings(engine=engine, agent=agent, store=store)


def default_db_path() -> Path:
    """The sessions database in the user data folder (platformdirs), e.g. ~/.local/share/kvdeck/kvdeck.db."""
    import platformdirs

    return Path(platformdirs.user_data_dir("kvdeck")) / "kvdeck.db"


# ---- the run configuration ----------------------------------------------------------------
_SWITCHES = {"on": True, "off": False, "true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}


@dataclass(frozen=True)
class RunConfig:
    """How a session ran: the one object a replay changes (`with_`). Stored as JSON with the session.

    threads 0 = all cores; kv_pages 0 = sized for the model's context; tools = the tool names.
    """

    model: str = "smollm2-135m"
    model_sha256: str = ""
    weight_format: str = "nvfp4"
    activations: str = "auto"  # what the integer matmuls ran with (a8 | a16); "auto" in records older than the field
    kv_format: str = "f32"
    backend: str = "cpu"
    threads: int = 0
    kv_pages: int = 0
    kv_block: int = 16
    prefix_cache: bool = True
    prewarm: bool = True
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    max_steps: int = 4
    max_tokens: int = 200
    call_max_tokens: int = 160
    follow_up: str = "none"
    tools: tuple[str, ...] = ()
    workspace: str = "workspace"

    def with_(self, **changes) -> RunConfig:
        """A changed copy; unknown field names are a ConfigError naming them."""
        known = {f.name for f in fields(self)}
        bad = sorted(set(changes) - known)
        if bad:
            raise ConfigError(f"RunConfig has no field {', '.join(bad)} (fields: {', '.join(sorted(known))})")
        if "tools" in changes:
            changes["tools"] = tuple(changes["tools"])
        return replace(self, **changes)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["tools"] = list(self.tools)
        return d

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> RunConfig:
        """Build from a stored dict; fields it lacks take their defaults, unknown ones are an error."""
        if not isinstance(d, dict):
            raise ConfigError(f"a run configuration is a JSON object, got {type(d).__name__}")
        return cls().with_(**d)


# Short names `kvdeck replay --with` accepts, besides every RunConfig field name.
RUN_ALIASES = {"weights": "weight_format", "act": "activations", "kv": "kv_format", "cache": "prefix_cache", "pages": "kv_pages",
               "block": "kv_block", "steps": "max_steps"}


def parse_changes(spec: str) -> dict:
    """'weights=f16,cache=off,pages=64' → RunConfig changes, typed by the field. ConfigError names the bad item."""
    types = {f.name: f.type for f in fields(RunConfig)}
    out: dict = {}
    for item in filter(None, (x.strip() for x in spec.split(","))):
        key, sep, value = item.partition("=")
        key = RUN_ALIASES.get(key.strip(), key.strip())
        if not sep or key not in types:
            raise ConfigError(f"--with {item!r}: expected FIELD=VALUE with FIELD one of "
                              f"{', '.join(sorted(set(types) | set(RUN_ALIASES)))}")
        kind, value = types[key], value.strip()
        try:
            if kind == "bool":
                if value.lower() not in _SWITCHES:
                    raise ValueError("expected on/off")
                out[key] = _SWITCHES[value.lower()]
            elif kind == "int":
                out[key] = int(value)
            elif kind == "float":
                out[key] = float(value)
            elif kind.startswith("tuple"):
                out[key] = tuple(v for v in value.split("+") if v)
            else:
                out[key] = value
        except ValueError as e:
            raise ConfigError(f"--with {item!r}: {e}") from None
    return out


def file_sha256(path: Path) -> str:
    """sha256 of a (weights) file, remembered in the user cache folder by path, size and mtime."""
    import platformdirs

    st = path.stat()
    key = hashlib.blake2b(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode(), digest_size=12).hexdigest()
    cache = Path(platformdirs.user_cache_dir("kvdeck")) / "sha256" / key
    try:
        return cache.read_text().strip()
    except OSError:
        pass
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    digest = h.hexdigest()
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(digest)
    except OSError:
        pass
    return digest
