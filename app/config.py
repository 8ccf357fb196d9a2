"""Settings: frozen dataclasses, one loader (TOML file, then command-line flags).

The file is $KVDECK_CONFIG or ~/.config/kvdeck/config.toml when it exists:

    [engine]
    model = "smollm2-135m"    # a name under the models folder, or a path
    weights = "nvfp4"         # nvfp4 | w4a8 | f16 | f32
    kv = "f32"                # f32 | f16
    threads = 0               # 0: all cores

    [agent]
    tools_dir = ""            # a folder of .py files whose public typed functions become tools
    workspace = "workspace"   # the file / outbox tools stay inside this folder
    notes_dir = ""            # the knowledge base for search_notes ("" = the shipped demo notes)
    max_steps = 4             # engine calls per user turn
    tool_timeout_s = 10.0     # a tool call running longer returns a timeout error to the model
    max_tokens = 200          # tokens per free reply
    follow_up = "none"        # tool_choice after a tool result: "none" answers from it (the 135M default
                              # model loops on "auto"); "auto" lets a larger model chain tools
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, fields, replace
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
    max_context: int = 4096


@dataclass(frozen=True)
class AgentSettings:
    tools_dir: str = ""
    workspace: str = "workspace"
    notes_dir: str = ""
    max_steps: int = 4
    tool_timeout_s: float = 10.0
    max_tokens: int = 200
    follow_up: str = "none"


@dataclass(frozen=True)
class Settings:
    engine: EngineSettings = EngineSettings()
    agent: AgentSettings = AgentSettings()


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
    engine = replace(engine, **{k: v for k, v in overrides.items() if v is not None})
    return Settings(engine=engine, agent=agent)
