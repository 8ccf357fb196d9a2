#!/usr/bin/env bash
# One device call for the attention kernels: build the module and gpu_bench for this GPU, run the
# attention tests (kernel checks against float64, backend against the CPU, whole-model bound),
# then gpu_bench --attn (decode variants at 4K-32K, prefill tensor cores vs the f32 kernel),
# attn_formats.py (decode per KV format through the backend, prefill A/B) and the prefill
# tok/s of the SmolLM2- and Llama-3-8B-shaped models with KVDECK_CUDA_ATTN_PREFILL=mma vs paged (default).
# The tests step runs tests/cuda/test_backend_cuda.py: the opt-in kernels (NEW_ENV) included.
#   attn_session.sh OUT [tests] [bench] [kcheck] [model]
set -uo pipefail
out=$1; shift
root=$(cd "$(dirname "$0")/../../../.." && pwd)
cd "$root"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"  # attn_formats.py imports app
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$out/gpu.txt"
t0=$(date +%s)
cmake -S . -B build/dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVDECK_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DPython_EXECUTABLE="$(command -v python3)" -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)" >"$out/cmake.log" 2>&1 \
  || { tail -40 "$out/cmake.log"; exit 1; }
# the module and gpu_bench at once (attention_mma.cu's 100 kernels are the long pole of both)
KVDECK_CUDA_ARCH=-arch=sm_90 JOBS=12 bash native/kernels/cuda/bench/build.sh build/gpu_bench >"$out/bench_build.log" 2>&1 &
bpid=$!
cmake --build build/dev -j16 >"$out/build.log" 2>&1 || { grep -E "error|Error" -A4 "$out/build.log" | head -80; exit 1; }
cp build/dev/_native*.so app/engine/
wait $bpid || { grep -E "error" -A4 "$out/bench_build.log" | head -40; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
export KVDECK_GPU_BENCH=$root/build/gpu_bench
for step in "$@"; do
  case $step in
    tests)
      timeout 240 python3 -m pytest -q -s -p no:cacheprovider tests/cuda/test_backend_cuda.py \
        -k "attention or (model_logits and nvfp4-) or new_attention or cache_hit or graph_replay" \
        2>&1 | tee "$out/pytest.log" | grep -E "passed|failed|FAIL|Error|error|cuda vs cpu|cache hit" | tail -60 ;;
    bench)
      timeout 240 build/gpu_bench --attn --reps 15 --json "$out/attn.json" 2>&1 | tee "$out/gpu_bench_attn.log" \
        | grep -vE "^PASS" | tail -80
      timeout 120 python3 native/kernels/cuda/bench/attn_formats.py --reps 5 2>&1 | tee "$out/attn_formats.log"
      timeout 120 python3 native/kernels/cuda/bench/attn_formats.py --prefill --reps 3 2>&1 | tee -a "$out/attn_formats.log" ;;
    kcheck)  # the kernel checks as tests (gpu_bench --quick, already built)
      timeout 120 python3 -m pytest -q -p no:cacheprovider tests/cuda/test_kernels_cuda.py 2>&1 | tail -5 ;;
    model)  # prefill tok/s (512) with the tensor-core prefill attention and with the f32 kernel
      timeout 150 python3 - <<'EOF' 2>&1 | grep -v Warning | tee "$out/prefill_model.log"
import os
from app.bench import gpu_model
from app.bench.gpu import prefill_tps
for model, kv, kw in (("smollm2-135m", "f16", {}), ("smollm2-135m", "nvfp4", {}),
                      ("llama3-8b", "nvfp4", {"head": "nvfp4", "embed": "f16"})):
    t = gpu_model.random_tensors(model, "nvfp4", kw.get("head", "w8a8"), seed=0, embed=kw.get("embed", "f32"))
    res = {}
    big = model.startswith("llama")
    for mode in ("paged", "mma") if big else ("paged", "mma", "paged", "mma"):
        os.environ["KVDECK_CUDA_ATTN_PREFILL"] = mode  # read at backend creation
        eng = gpu_model.build(model, "nvfp4", kv, "cuda", tensors=t, max_context=8192, **kw)
        res[mode] = max(res.get(mode, 0.0), prefill_tps(eng, 512, 1 if big else 3))
        del eng
    print(f"{model} nvfp4 weights, {kv} KV: prefill 512 tok/s: tensor-core attention {res['mma']:.0f}, "
          f"f32 paged kernel {res['paged']:.0f} ({res['mma'] / res['paged']:.2f}x)", flush=True)
    del t
EOF
      ;;
  esac
done
echo "total: $(( $(date +%s) - t0 )) s"
