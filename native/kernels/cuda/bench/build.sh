#!/usr/bin/env bash
# Build gpu_bench: kvdeck's CUDA kernels, the benchmark, and the CPU oracle it links
# (native/src/formats.cpp codecs, the scalar CPU kernels, the KV row codec).
#   build.sh [OUT] [-j N]      OUT defaults to build/cuda/gpu_bench
# KVDECK_CUDA_ARCH overrides the target (default: -arch=native, the GPU of this machine).
set -euo pipefail
root=$(cd "$(dirname "$0")/../../../.." && pwd)
out=${1:-$root/build/cuda/gpu_bench}
jobs=${JOBS:-$(nproc)}
arch=${KVDECK_CUDA_ARCH:--arch=native}
obj=$(dirname "$out")/obj
mkdir -p "$obj"
flags=(-O3 -std=c++17 $arch -I"$root/native/include" -I"$root/native" -I"$root/native/kernels/cuda")
srcs=("$root"/native/kernels/cuda/*.cu "$root"/native/kernels/cuda/bench/*.cu
      "$root/native/src/formats.cpp" "$root/native/kernels/cpu/gemm_scalar.cpp"
      "$root/native/kernels/cpu/kv_codec_cpu.cpp" "$root/native/kernels/cpu/f16_rows.cpp"
      "$root/native/kernels/cpu/gemm_repack.cpp")
pids=()
objs=()
for s in "${srcs[@]}"; do
  o="$obj/$(basename "$s").o"
  objs+=("$o")
  nvcc "${flags[@]}" -c "$s" -o "$o" &
  pids+=($!)
  if (( ${#pids[@]} >= jobs )); then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
done
for p in "${pids[@]}"; do wait "$p"; done
nvcc "${flags[@]}" "${objs[@]}" -o "$out"
echo "built $out"
