"""CUDA kernels (native/kernels/cuda) against the CPU oracle, on a GPU.

Builds native/kernels/cuda/bench/gpu_bench with nvcc for this machine's GPU and runs its
validation (`--quick`): the activation quantiser bit for bit against the CPU's, the NVFP4 and
W4A8 GEMVs against the CPU scalar kernels (sampled rows, batch 1..8, padded K), paged decode
attention over f16, NVFP4, NVFP4R and K8V4 pages against a float64 softmax, prefill attention (the f32 paged
kernel and the tensor-core one, with and without the chunk's own rows unrounded) against float64, RMSNorm / RoPE / SiLU-mul, and
the fused quantise + GEMV kernels, and the launchers' refusal of unsupported shapes. Skipped where there is no nvcc or no GPU (CI).
Set KVDECK_GPU_BENCH to a built gpu_bench to skip the build.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.cuda

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "native" / "kernels" / "cuda" / "bench" / "build.sh"


def _have_gpu() -> bool:
    if shutil.which("nvcc") is None or shutil.which("nvidia-smi") is None:
        return False
    r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return r.returncode == 0 and "GPU" in r.stdout


@pytest.fixture(scope="module")
def validation(tmp_path_factory) -> tuple[int, str]:
    if not _have_gpu():
        pytest.skip("needs nvcc and an NVIDIA GPU")
    exe = os.environ.get("KVDECK_GPU_BENCH")
    if not exe:
        exe = str(tmp_path_factory.mktemp("cuda") / "gpu_bench")
        subprocess.run(["bash", str(BUILD), exe], check=True, timeout=900)
    r = subprocess.run([exe, "--quick"], capture_output=True, text=True, timeout=600)
    return r.returncode, r.stdout + r.stderr


def _lines(out: str, name: str) -> list[str]:
    return [ln for ln in out.splitlines() if re.match(r"^(PASS|FAIL)\s", ln) and name in ln]


def test_every_check_passes(validation):
    rc, out = validation
    fails = [ln for ln in out.splitlines() if ln.startswith("FAIL")]
    assert rc == 0 and not fails, "\n".join(fails) or out[-4000:]
    assert re.search(r"^PASS: (\d+) of \1 checks passed", out, re.M), out[-2000:]


@pytest.mark.parametrize("name, count", [
    ("act_q8", 18), ("nvfp4_dp4a vs cpu", 18), ("nvfp4_f16", 18), ("w4a8 vs cpu", 18), ("w4a8 pdl vs cpu", 18),
    ("nvfp4_posneg vs cpu", 3), ("nvfp4 q8fused vs cpu", 3), ("w4a8 q8fused vs cpu", 3),
    # decode: 6 shapes + the small-values case (decoded through f16 subnormals, session 7)
    ("attn_f32 vs", 7), ("attn_f16 vs", 7), ("attn_nvfp4 vs", 7), ("attn_f32_simt", 7), ("attn_f16_simt", 7),
    ("attn_nvfp4_mma", 7),
    ("attn_nvfp4r vs", 7), ("attn_nvfp4r_mma", 7), ("attn_k8v4 vs", 7), ("attn_k8v4_mma", 7),
    *[(f"attn_prefill_{kv}{fr}_{kern}", n) for kv in ("f32", "f16", "nvfp4", "nvfp4r", "k8v4")
      for fr, n in (("", 3), ("_fresh", 2)) for kern in ("paged vs", "mma vs", "mma16 vs")],
    ("rmsnorm", 2), ("rope", 1), ("silu_mul", 1), ("contracts", 1),
])
def test_each_kernel_was_checked(validation, name, count):
    """Every kernel ran its checks (a kernel that silently skipped would not be listed)."""
    _, out = validation
    lines = _lines(out, name)
    assert len(lines) == count and all(ln.startswith("PASS") for ln in lines), "\n".join(lines) or out[-2000:]
