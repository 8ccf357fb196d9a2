#!/usr/bin/env bash
# One call on a CUDA machine (the `device` tool's H200): build the Python module with the CUDA
# backend for this GPU, run the CUDA tests, then the benchmarks; logs and JSON under OUT.
#   device_session.sh OUT [gemm] [fused] [tests] [bench] [peer] [8b] [profile] [prefill] [ab] [pf8b] [kernels] [gemv1] [real] [seed] [cpu] [noseed]
# ab: decode_ab.py (interleaved A/B of the decode switches: SmolLM2 and the 8B shape); with pf8b among the
#     steps also the 32-layer 8B prefill A/B (NVFP4 on the f16 mma / on the int8 mma, GEMM_NVFP4=i8) on that engine.
# tests: TESTS_K in the environment selects tests by pytest -k (e.g. "not new_attention").
# 8b: `bench gpu` whole (with the seed-000 rows unless noseed is among the steps).
# fused: bench/fused/check_fused.cu (fused.cu's norm / silu kernels: bit-exactness and µs per launch), both
#        ways (KVDECK_CUDA_NORM_SERIAL=0 / 1), linked against the module build's objects.
# peer: llama.cpp's llama-bench (../shared/tools/llamacpp-peer's fetch.sh -> .peer, carried) as the same run's
#       peer: built on cores 6-15 in the background from the start (~5 min) with its random 8B Q4_0 GGUF; the
#       step waits for it, runs pp512 / tg128 at depth 0 and 4096, flash attention on, -r 3, into
#       OUT/llama-bench-8b.jsonl, which a later `8b` step passes to `bench gpu --peer`. Put it before `8b`.
# gemv1: gpu_bench --gemv1 (the batch-1 GEMV rows of the five 8B shapes, validated, incl. the R/U tune
#        rows), gpu_bench built with bench/build.sh on cores 8-15 in the background from the start.
# real: the fetched default model (carried by device_weights.sh) through tests/cuda/test_real_model.py
#       and the seed-000 task via `kvdeck check-prefix --device cuda` (wheels carried in .whl/).
# Needs cmake, ninja, pybind11, numpy and pytest under python3 (the device image has them).
set -uo pipefail
out=$1; shift
root=$(cd "$(dirname "$0")/../../../.." && pwd)
cd "$root"
export PYTHONUNBUFFERED=1
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$out/gpu.txt"
t0=$(date +%s)
peer_pid=
if [[ " $* " == *" peer "* ]]; then
  if [ -f .peer/device.sh ]; then
    ( b=/tmp/llamacpp-build; arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
      taskset -c 6-15 cmake -S .peer/llama.cpp -B $b -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" \
        -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=OFF && taskset -c 6-15 cmake --build $b --target llama-bench -j10 \
      && PYTHONPATH=.peer/llama.cpp/gguf-py taskset -c 6-15 python3 .peer/random_gguf.py 8b Q4_0 /tmp/random-8b-Q4_0.gguf
    ) >/tmp/peer-build.log 2>&1 &
    peer_pid=$!
  else
    echo "peer: no .peer here (run ../shared/tools/llamacpp-peer/fetch.sh and carry .peer)"
  fi
fi
gb_pid=
if [[ " $* " == *" gemv1 "* ]]; then
  ( KVDECK_CUDA_ARCH=-arch=sm_90 JOBS=8 taskset -c 8-15 bash native/kernels/cuda/bench/build.sh build/cuda/gpu_bench ) \
    >/tmp/gpu-bench-build.log 2>&1 &
  gb_pid=$!
fi
cmake -S . -B build/dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVDECK_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DPython_EXECUTABLE="$(command -v python3)" -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)" >"$out/cmake.log" 2>&1 \
  || { tail -40 "$out/cmake.log"; exit 1; }
cmake --build build/dev -j16 >"$out/build.log" 2>&1 || { grep -E "error|Error" -A4 "$out/build.log" | head -80; exit 1; }
cp build/dev/_native*.so app/engine/
echo "build: $(( $(date +%s) - t0 )) s"
# `kvdeck bench gpu` without the CLI's imports (the device image has no orjson)
gpu='import sys; from app.bench.gpu import run; sys.exit(run(sys.argv[1:]))'
pf8b=; [[ " $* " == *" pf8b "* ]] && pf8b=pf8b
noseed=; [[ " $* " == *" noseed "* ]] && noseed=--no-seed
for step in "$@"; do
  case $step in
    gemm)  # the prefill GEMM against the GEMV chunks it replaced, 8B shapes at M = 512 and 64
      nvcc -O3 -std=c++17 -arch=sm_90 -Inative/include -Inative -Inative/kernels/cuda \
        native/kernels/cuda/bench/gemm/bench_gemm_mma.cu native/kernels/cuda/gemm_mma.cu native/kernels/cuda/gemm_mma_nvfp4.cu \
        native/kernels/cuda/gemv.cu native/kernels/cuda/gemv_dense.cu -o build/bench_gemm_mma 2>&1 | tail -20
      for m in "512 sweep" 64 100; do timeout 120 build/bench_gemm_mma $m 2>&1 | tee -a "$out/gemm.log"; done ;;
    fused)
      o=build/dev/CMakeFiles/kvdeck_cuda.dir/native/kernels/cuda
      nvcc -O3 -std=c++17 -arch=sm_90 -Inative/include -Inative -Inative/kernels/cuda \
        native/kernels/cuda/bench/fused/check_fused.cu $o/fused.cu.o $o/gemv.cu.o $o/elementwise.cu.o \
        -o build/check_fused 2>&1 | tail -20
      for serial in 0 1; do
        KVDECK_CUDA_NORM_SERIAL=$serial timeout 60 build/check_fused 2>&1 | tee -a "$out/fused.log"
      done ;;
    tests)
      timeout 400 python3 -m pytest -q -s -p no:cacheprovider tests/cuda tests/native/test_backend_ops.py \
        ${TESTS_K:+-k "$TESTS_K"} 2>&1 | tee "$out/pytest.log" | tail -60 ;;
    bench)
      timeout 400 python3 -c "$gpu" --json "$out/bench_gpu.json" --no-8b 2>&1 | tee "$out/bench.log" ;;
    8b)
      peerarg=; [ -s "$out/llama-bench-8b.jsonl" ] && peerarg="--peer $out/llama-bench-8b.jsonl"
      timeout 400 python3 -c "$gpu" --json "$out/bench_gpu.json" $noseed $peerarg 2>&1 | tee "$out/bench.log" ;;
    peer)
      if [ -n "$peer_pid" ]; then
        w0=$(date +%s); wait $peer_pid; rc=$?
        echo "peer: build + GGUF ready $(( $(date +%s) - t0 )) s after the start (waited $(( $(date +%s) - w0 )) s), rc $rc"
        if [ $rc = 0 ]; then
          timeout 300 /tmp/llamacpp-build/bin/llama-bench -m /tmp/random-8b-Q4_0.gguf -fa 1 -p 512 -n 128 -d 0,4096 \
            -ngl 99 -r 3 -o jsonl -oe md > "$out/llama-bench-8b.jsonl"
        else
          tail -30 /tmp/peer-build.log
        fi
      fi ;;
    profile)
      for m in "smollm2-135m" "llama3-8b 8"; do
        PYTHONPATH=. timeout 200 python3 native/kernels/cuda/bench/profile_decode.py $m 2>&1 | grep -v Warning | tee -a "$out/profile.log"
      done ;;
    prefill)  # where a 512-token prefill's time goes (profile_prefill.py), 8B shape (8 layers) and SmolLM2, f16 vs int8 mma
      for m in "llama3-8b" "smollm2-135m"; do
        PYTHONPATH=. timeout 200 python3 native/kernels/cuda/bench/profile_prefill.py $m ab 2>&1 | grep -v -i warn | tee -a "$out/prefill.log"
      done ;;
    real)
      if [ -d .whl ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
          && export PYTHONPATH=/tmp/site
      fi
      timeout 300 python3 -m pytest -q -s -p no:cacheprovider tests/cuda/test_real_model.py 2>&1 | tee "$out/real.log" | tail -20
      for dev in cuda cpu; do
        timeout 300 python3 -m app check-prefix --task assets/tasks/seed000.toml --weights nvfp4 --kv f16 \
          --device $dev --db /tmp/seed-$dev.db 2>&1 | tee "$out/check_prefix_$dev.log" | tail -25
      done ;;
    seed)  # bench gpu's seed-000 rows, the CUDA backend only
      timeout 120 python3 -c "from app.bench import gpu_seed; gpu_seed.seed000({}, devices=('cuda',))" 2>&1 \
        | tee "$out/seed.log" ;;
    cpu)  # CPU kernel tests on this machine's CPU (the device's host has AVX-512 VNNI; ours does not)
      timeout 200 python3 -m pytest -q -p no:cacheprovider tests/native/test_a16.py tests/native/test_attention.py \
        2>&1 | tee "$out/cpu_tests.log" | tail -15 ;;
    ab)  # interleaved A/B of the decode step's switches, one process per model (decode_ab.py)
      for m in smollm2 "8b $pf8b"; do
        PYTHONPATH=. timeout 240 python3 native/kernels/cuda/bench/decode_ab.py $m 2>&1 | tee -a "$out/ab.log"
      done ;;
    gemv1)
      wait $gb_pid || { tail -30 /tmp/gpu-bench-build.log; continue; }
      timeout 200 build/cuda/gpu_bench --gemv1 --json "$out/gemv1.json" 2>&1 | tee "$out/gemv1.log" | tail -80 ;;
    kernels)
      timeout 500 python3 native/kernels/cuda/bench/run_bench.py --json "$out/kernels.json" 2>&1 \
        | tee "$out/kernels.log" | tail -60 ;;
  esac
done
echo "total: $(( $(date +%s) - t0 )) s"
