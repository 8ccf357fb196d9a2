"""The tensor-core attention kernels' own CUDA source run on the CPU (no GPU needed).

native/kernels/cuda/bench/emu/attn_emu.cpp compiles attention_prefill.cu and attention_mma.cu
as host code through emu.h (threads of a block as OS threads, warp collectives — shuffles,
mma.sync m16n8k16, ldmatrix — exchanged between warp barriers per the PTX ISA's fragment
layouts) and checks them against a float64 softmax over the rows as the CPU codecs decode them:
prefill over f16 / NVFP4 / f32 / NVFP4R / K8V4 pages (fresh rows, q hi + lo and f16, row /
token tile tails, a warp skipping a tile), the decode split kernel over NVFP4, NVFP4R and K8V4
(also with many chunks a warp and with pages of 32 tokens),
and the split combine writing the o projection's q8 (bit-equal to quantize_act_q8's contract);
the fused decode kernel (the <= 4 splits and the combine in one block per KV head) bit-equal to
the split kernel + combine kernel in out and q8, with and without the fresh token.
A vector load from a misaligned address stops the run (as it faults on the GPU). What this
cannot show: timing, and other faults only hardware raises (resources, races); tests/cuda runs
the same kernels on a GPU. Skipped without g++ or the CUDA headers.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from cuda_emu_helpers import cuda_home

ROOT = Path(__file__).resolve().parents[2]



@pytest.fixture(scope="module")
def emu_run(tmp_path_factory) -> str:
    cuda, gxx = cuda_home(), shutil.which("g++")
    if cuda is None or gxx is None:
        pytest.skip("needs g++ and the CUDA headers / libcudart_static")
    exe = tmp_path_factory.mktemp("emu") / "attn_emu"
    srcs = ["native/kernels/cuda/bench/emu/attn_emu.cpp", "native/kernels/cpu/kv_codec_cpu.cpp",
            "native/kernels/cpu/f16_rows.cpp", "native/src/formats.cpp"]
    cmd = [gxx, "-std=c++20", "-O0", "-w", "-DKVDECK_CUDA_EMU=1", f"-I{cuda}/include", "-Inative/include", "-Inative",
           "-Inative/kernels/cuda", *srcs, f"-L{cuda}/lib64", "-lcudart_static", "-ldl", "-lrt", "-lpthread",
           "-o", str(exe)]
    subprocess.run(cmd, cwd=ROOT, check=True, timeout=600)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600)
    return r.stdout + r.stderr + f"\nrc={r.returncode}"


def test_every_emulated_check_passes(emu_run):
    fails = [ln for ln in emu_run.splitlines() if ln.startswith("FAIL")]
    assert not fails and emu_run.rstrip().endswith("rc=0"), emu_run[-3000:]
    m = re.search(r"^PASS: (\d+) of (\d+) checks passed", emu_run, re.M)
    assert m and m.group(1) == m.group(2) == "39", emu_run[-2000:]


@pytest.mark.parametrize("what", ["prefill f16 M", "prefill f16 q16", "prefill nvfp4 fresh", "prefill nvfp4 M",
                                  "prefill f16 fresh", "prefill f32 M", "prefill nvfp4r fresh", "prefill nvfp4r M",
                                  "prefill k8v4 M", "prefill k8v4 fresh", "decode nvfp4 ctx", "decode nvfp4r",
                                  "decode k8v4", "combine+q8 nvfp4", "combine+q8 nvfp4r",
                                  "combine+q8 k8v4", "decode nvfp4 ctx=3000/40000",
                                  "decode nvfp4 ctx=1000/20000 h=8/2 D=128 B=32", "decode nvfp4r ctx=2990/40000",
                                  "decode k8v4 ctx=1500/30000 h=3/1 D=64 B=32",
                                  "fused == split+combine nvfp4 ctx=17/256 h=8/2 D=128 fresh q8",
                                  "fused == split+combine nvfp4 ctx=0/64", "fused == split+combine nvfp4 ctx=70/200"])
def test_each_kernel_variant_was_checked(emu_run, what):
    assert any(ln.startswith("PASS " + what) for ln in emu_run.splitlines()), emu_run[-2000:]
