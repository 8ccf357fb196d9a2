"""Shared fixtures: the default model (fetched by `make test`) and engines cached per format."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

MODEL = "smollm2-135m"


def model_root() -> Path:
    from app.engine import default_models_dir

    return default_models_dir() / MODEL


@pytest.fixture(scope="session")
def root() -> Path:
    r = model_root()
    if not (r / "f32" / "config.json").is_file():
        pytest.fail(f"{r}: the default model is not fetched; run `make test` (it runs `kvdeck models fetch {MODEL}`)")
    return r


@functools.lru_cache(maxsize=None)
def _engine(weights: str, kv: str):
    from app.engine import load_engine

    return load_engine(model_root(), weights=weights, kv=kv)


@pytest.fixture(scope="session")
def engine(root):
    """engine(weights, kv="f32") -> a loaded Engine, shared across the session."""
    return _engine
