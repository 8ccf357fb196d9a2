"""--device / [engine] device: a backend this build or machine cannot run is a clear error."""

from __future__ import annotations

import pytest

from app.config import load_settings
from app.engine import EngineError, _native, load_engine


def test_device_setting_defaults_to_cpu_and_is_overridable(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('[engine]\ndevice = "cuda"\n')
    assert load_settings(path=tmp_path / "none.toml").engine.device == "cpu"
    assert load_settings(path=f).engine.device == "cuda"
    assert load_settings(path=f, device="cpu").engine.device == "cpu"


@pytest.mark.skipif("cuda" in _native.backends(), reason="a usable GPU is present")
def test_cuda_without_a_gpu_names_the_reason(root):
    want = "no CUDA device: " if "cuda" in _native.built_backends() else "not available in this build"
    with pytest.raises(EngineError, match=f"device 'cuda': .*{want}"):
        load_engine(root, weights="nvfp4", device="cuda", max_context=64)


def test_unknown_device_is_refused(root):
    with pytest.raises(EngineError, match="backend 'tpu' is not available in this build"):
        load_engine(root, weights="nvfp4", device="tpu", max_context=64)
