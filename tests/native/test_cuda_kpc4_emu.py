"""The KPC4 CUDA kernels' own source run on the CPU (no GPU needed).

native/kernels/cuda/bench/emu/kpc4_emu.cpp compiles kv_write_kpc4.cu and attention_kpc4.cu as
host code through emu.h (see test_cuda_attention_emu.py for what the emulation does and cannot
show) and checks: the KV write (rows into the open page's f32 staging, V rows as NVFP4, a K page
encoded when its 16th row lands, over prefill chunks and single decode rows) and the pages-to-f32
decoder byte for byte against the CPU codec (kv_codec_pce.cpp, kv_codec_cpu.cpp); decode
attention on the tensor cores with the scores on the K codes against a float64 softmax over
the rows as the CPU decodes them, the query's own page unrounded. Here the same decode cases'
outputs are also compared with the CPU backend's own kpc4 attention (BackendOps("cpu")).
Skipped without g++ or the CUDA headers.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from cuda_emu_helpers import cuda_home

from app.engine import _native

ROOT = Path(__file__).resolve().parents[2]



@pytest.fixture(scope="module")
def emu_run(tmp_path_factory) -> tuple[str, Path]:
    cuda, gxx = cuda_home(), shutil.which("g++")
    if cuda is None or gxx is None:
        pytest.skip("needs g++ and the CUDA headers / libcudart_static")
    tmp = tmp_path_factory.mktemp("kpc4_emu")
    exe = tmp / "kpc4_emu"
    srcs = ["native/kernels/cuda/bench/emu/kpc4_emu.cpp", "native/kernels/cpu/kv_codec_cpu.cpp",
            "native/kernels/cpu/kv_codec_pce.cpp", "native/kernels/cpu/f16_rows.cpp", "native/src/formats.cpp"]
    # gc-sections: kv_codec_pce.cpp's ISA dispatchers (never called here) need no kernel tables
    cmd = [gxx, "-std=c++20", "-O1", "-w", "-ffunction-sections", "-Wl,--gc-sections", "-DKVDECK_CUDA_EMU=1",
           f"-I{cuda}/include", "-Inative/include", "-Inative", "-Inative/kernels/cuda", *srcs, f"-L{cuda}/lib64",
           "-lcudart_static", "-ldl", "-lrt", "-lpthread", "-o", str(exe)]
    subprocess.run(cmd, cwd=ROOT, check=True, timeout=600)
    dump = tmp / "dump"
    dump.mkdir()
    r = subprocess.run([str(exe), str(dump)], capture_output=True, text=True, timeout=600)
    return r.stdout + r.stderr + f"\nrc={r.returncode}", dump


def test_every_emulated_check_passes(emu_run):
    out, _ = emu_run
    fails = [ln for ln in out.splitlines() if ln.startswith("FAIL")]
    assert not fails and out.rstrip().endswith("rc=0"), out[-3000:]
    m = re.search(r"^PASS: (\d+) of (\d+) checks passed", out, re.M)
    assert m and m.group(1) == m.group(2) == "19", out[-2000:]


@pytest.mark.parametrize("what", ["codec K pages", "codec V rows", "codec staging rows", "codec pages to f32",
                                  "decode kpc4 ctx=1/", "decode kpc4 ctx=16/", "decode kpc4 ctx=17/",
                                  "decode kpc4 ctx=2305/"])
def test_each_check_ran(emu_run, what):
    out, _ = emu_run
    assert any(ln.startswith("PASS " + what) for ln in out.splitlines()), out[-2000:]


def _load(path: Path):
    raw = path.read_bytes()
    ctx, nkv, nh, D = np.frombuffer(raw[:16], dtype=np.int32)
    f = np.frombuffer(raw[16:], dtype=np.float32)
    n_q, n_kv = nh * D, ctx * nkv * D
    q = f[:n_q].reshape(1, nh * D)
    k = f[n_q:n_q + n_kv].reshape(ctx, nkv, D)
    v = f[n_q + n_kv:n_q + 2 * n_kv].reshape(ctx, nkv, D)
    out = f[n_q + 2 * n_kv:].reshape(1, nh * D)
    assert out.size == nh * D
    return int(ctx), q, k, v, out


def test_decode_matches_the_cpu_backends_kpc4_attention(emu_run):
    """The emulated GPU decode against the CPU backend's kpc4 path on the same rows (written in one
    kv_write there, a prefill plus the step's row in the emulation: the same pages either way).
    The CPU computes k' = lo + code step in f32 and an f32 softmax; the GPU rounds q and p to f16
    (attention_mma.cu's ~5e-4), so the bound is the float64 check's."""
    _, dump = emu_run
    files = sorted(dump.glob("decode_*.bin"))
    assert len(files) == 7
    ops = _native.BackendOps("cpu", 2)
    for f in files:
        ctx, q, k, v, out = _load(f)
        ref = ops.attention(q, k, v, ctx - 1, "kpc4")
        err = np.abs(out - ref).max() / np.abs(ref).max()
        assert err < 3e-3, (f.name, ctx, err)
        if ctx > 16:  # rounded pages are read: f32 KV differs visibly (the check can tell the formats apart)
            f32 = ops.attention(q, k, v, ctx - 1, "f32")
            assert np.abs(out - f32).max() / np.abs(f32).max() > 5 * err, (f.name, ctx)
