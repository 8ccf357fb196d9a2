#!/usr/bin/env bash
# One device call for the attention kernels: build the module and gpu_bench for this GPU, run the
# attention tests (kernel checks against float64, backend against the CPU and against the f32
# paged kernel, whole-model bound), then gpu_bench --attn (decode variants at 4K-32K, prefill
# tensor cores vs the f32 paged kernel), attn_formats.py (decode / prefill per KV format through
# the backend) and attn_model_ab.py (whole-model prefill tok/s and decode µs/token, default
# kernels vs KVDECK_CUDA_ATTN_PREFILL=paged / KVDECK_CUDA_ATTN_DECODE=paged, interleaved).
#   attn_session.sh OUT [tests] [bench] [decode] [ncu] [formats] [kcheck] [model] [kpc4]
# (kpc4: tests/cuda/test_kpc4_cuda.py, the opt-in KVDECK_CUDA_KPC4=1 path; its kernel rows,
# attn_kpc4_mma at 4K / 16K / 32K, come with `bench`. ncu: gpu_bench --profile-attn under Nsight
# Compute, f16 and NVFP4 at 4K / 32K, each kernel once.) GPU_BENCH=path: a gpu_bench built
# elsewhere for sm_90 (build.sh with KVDECK_CUDA_ARCH=-arch=sm_90), not rebuilt here; the module
# then builds in the background while the gpu_bench steps run, and `tests` waits for it.
# TESTS_K / TESTS_TIMEOUT: the tests step's pytest -k selection and time limit (s).
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
if [ -n "${GPU_BENCH:-}" ]; then  # prebuilt gpu_bench: the module builds in the background
  ( cmake --build build/dev -j12 >"$out/build.log" 2>&1 && cp build/dev/_native*.so app/engine/ && echo "module: $(( $(date +%s) - t0 )) s" ) &
  mpid=$!
  gb=$GPU_BENCH
else
  # the module and gpu_bench at once (attention_mma.cu's 100 kernels are the long pole of both)
  KVDECK_CUDA_ARCH=-arch=sm_90 JOBS=12 bash native/kernels/cuda/bench/build.sh build/gpu_bench >"$out/bench_build.log" 2>&1 &
  bpid=$!
  cmake --build build/dev -j16 >"$out/build.log" 2>&1 || { grep -E "error|Error" -A4 "$out/build.log" | head -80; exit 1; }
  cp build/dev/_native*.so app/engine/
  wait $bpid || { grep -E "error" -A4 "$out/bench_build.log" | head -40; exit 1; }
  echo "build: $(( $(date +%s) - t0 )) s"
  mpid=
  gb=build/gpu_bench
fi
export KVDECK_GPU_BENCH=$(cd "$(dirname "$gb")" && pwd)/$(basename "$gb")
for step in "$@"; do
  case $step in
    tests)
      if [ -n "$mpid" ]; then wait $mpid || { grep -E "error|Error" -A4 "$out/build.log" | head -80; exit 1; }; mpid=; fi
      timeout "${TESTS_TIMEOUT:-300}" python3 -m pytest -q -s -p no:cacheprovider tests/cuda/test_backend_cuda.py \
        -k "${TESTS_K:-attention or model_logits or cache_hit or graph_replay or kv_write or greedy}" \
        2>&1 | tee "$out/pytest.log" | grep -E "passed|failed|FAIL|Error|error|cuda vs cpu|cache hit" | tail -60 ;;
    bench)
      timeout 240 "$KVDECK_GPU_BENCH" --attn --reps 15 --json "$out/attn.json" 2>&1 | tee "$out/gpu_bench_attn.log" \
        | grep -vE "^PASS" | tail -100 ;;
    decode)  # the decode rows only (gpu_bench --attn-decode: no prefill, no kpc4, no f32)
      timeout 120 "$KVDECK_GPU_BENCH" --attn-decode --reps 15 --json "$out/attn_decode.json" 2>&1 \
        | tee "$out/gpu_bench_decode.log" | grep -vE "^PASS" | tail -100 ;;
    ncu)  # Nsight Compute: duration, DRAM / SM throughput, occupancy, warp stalls, issue slots
      timeout 150 ncu --clock-control none --section SpeedOfLight --section LaunchStats --section Occupancy \
        --section WarpStateStats --section SchedulerStats "$KVDECK_GPU_BENCH" --profile-attn >"$out/ncu.txt" 2>&1
      grep -E "attn_|Duration|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Issued Ipc|No Eligible|Stall|Registers Per|Grid Size|PROFILE" \
        "$out/ncu.txt" | head -120 ;;
    formats)
      timeout 120 python3 native/kernels/cuda/bench/attn_formats.py --reps 5 2>&1 | tee "$out/attn_formats.log"
      timeout 120 python3 native/kernels/cuda/bench/attn_formats.py --prefill --reps 3 2>&1 | tee -a "$out/attn_formats.log" ;;
    kcheck)  # the kernel checks as tests (gpu_bench --quick, already built)
      timeout 120 python3 -m pytest -q -p no:cacheprovider tests/cuda/test_kernels_cuda.py 2>&1 | tail -5 ;;
    model)  # whole-model A/B: prefill 512 tok/s and decode µs/token, default kernels vs paged
      timeout 240 python3 native/kernels/cuda/bench/attn_model_ab.py --prefill --decode --big 2>&1 \
        | grep -v Warning | tee "$out/model_ab.log" ;;
    kpc4)  # kpc4 KV on the GPU (opt-in): codec bytes, decode / prefill vs the CPU, whole model
      timeout 240 python3 -m pytest -q -s -p no:cacheprovider tests/cuda/test_kpc4_cuda.py 2>&1 \
        | tee "$out/kpc4.log" | grep -E "passed|failed|FAIL|Error|error|kpc4" | tail -40 ;;
  esac
done
[ -n "$mpid" ] && wait $mpid
echo "total: $(( $(date +%s) - t0 )) s"
