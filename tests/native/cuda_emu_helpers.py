"""What the CUDA-emulation tests need from the machine: a CUDA toolkit's headers and static runtime
(the emulator compiles the kernels' .cu source with g++ against them)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def cuda_home() -> Path | None:
    """The CUDA toolkit folder (CUDA_HOME, CUDA_PATH, /usr/local/cuda, or nvcc's) holding
    cuda_fp16.h and libcudart_static.a; None when there is none."""
    for base in filter(None, [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]):
        if (Path(base) / "include" / "cuda_fp16.h").exists() and (Path(base) / "lib64" / "libcudart_static.a").exists():
            return Path(base)
    nvcc = shutil.which("nvcc")
    if nvcc:
        base = Path(nvcc).resolve().parents[1]
        if (base / "include" / "cuda_fp16.h").exists() and (base / "lib64" / "libcudart_static.a").exists():
            return base
    return None
