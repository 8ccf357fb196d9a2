"""The engine layer: a thin Python handle over the native engine (app.engine._native).

Imports flow one way: nothing here imports the agent, the store, telemetry or the UI.
"""

from app.engine._native import CancelFlag  # stops a Session.precompute between layers (set() from any thread)
from app.engine.engine import Engine, Generation, Prewarm, TokenConstraint
from app.engine.session import Session
from app.engine.errors import EngineError, KvPoolFull
from app.engine.loader import default_models_dir, load_engine
from app.engine.types import CallStats, ModelConfig, SamplingParams

__all__ = [
    "CancelFlag",
    "CallStats",
    "Engine",
    "EngineError",
    "Generation",
    "KvPoolFull",
    "Prewarm",
    "ModelConfig",
    "SamplingParams",
    "Session",
    "TokenConstraint",
    "default_models_dir",
    "load_engine",
]
