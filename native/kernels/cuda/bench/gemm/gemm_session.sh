#!/usr/bin/env bash
# One device call for the prefill GEMM (session 8): build the module (in the background) and
# bench_gemm_mma, then the steps asked for; logs under OUT.
#   gemm_session.sh OUT [bench] [ncu] [tests] [e2e]
# bench: bench_gemm_mma at M 512 with the tile sweep (BENCH_ARGS, default "nv nohead": the NVFP4
#        kernels, formats 3 and 0), and validation at M 64 / 100 / 37.
# ncu:   Nsight Compute on one launch each of (format, tile, shape) in NCU_CASES (default: the
#        f16-mma kernel on o at one block a SM and gate_up at two a SM): the details page
#        (speed of light, occupancy, scheduler and warp-state statistics) and the instructions with
#        the most stall samples (source page, SASS).
# tests: the GEMM / matmul / prefill / whole-model tests of tests/cuda (TESTS_K overrides the -k
#        expression) and tests/native/test_backend_ops.py.
# e2e:   prefill_ab.py 8b $E2E_MODELS (the 32-layer 8B-shaped prefill, the arms of app/bench/gpu.py
#        interleaved; E2E_MODELS=smollm2 adds SmolLM2-135M).
set -uo pipefail
out=$1; shift
root=$(cd "$(dirname "$0")/../../../../.." && pwd)
cd "$root"
export PYTHONUNBUFFERED=1
mkdir -p "$out" build
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$out/gpu.txt"
t0=$(date +%s)
(
  cmake -S . -B build/dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVDECK_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DPython_EXECUTABLE="$(command -v python3)" -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)" &&
    cmake --build build/dev -j12 && cp build/dev/_native*.so app/engine/
) >"$out/build.log" 2>&1 &
bpid=$!
built=
module() {  # wait for the module build once
  [ -n "$built" ] && return "$built"
  wait $bpid; built=$?
  echo "module build: $(( $(date +%s) - t0 )) s (rc $built)" | tee -a "$out/gemm.log"
  [ "$built" = 0 ] || tail -40 "$out/build.log"
  return "$built"
}
nvcc -O3 -std=c++17 -arch=sm_90 -Inative/include -Inative -Inative/kernels/cuda \
  native/kernels/cuda/bench/gemm/bench_gemm_mma.cu native/kernels/cuda/gemm_mma.cu native/kernels/cuda/gemm_mma_nvfp4.cu \
  native/kernels/cuda/gemv.cu native/kernels/cuda/gemv_dense.cu -o build/bench_gemm_mma 2>&1 | tail -20
echo "bench build: $(( $(date +%s) - t0 )) s" | tee -a "$out/gemm.log"
for step in "$@"; do
  case $step in
    bench)
      timeout 120 build/bench_gemm_mma 512 ${BENCH_ARGS-nv nohead} sweep 2>&1 | tee -a "$out/gemm.log"
      for m in 64 100 37; do timeout 60 build/bench_gemm_mma $m ${BENCH_ARGS-nv nohead} 2>&1 | tee -a "$out/gemm.log"; done ;;
    ncu)
      cases=${NCU_CASES:-"3:4:o 3:0:gate_up"}
      for c in $cases; do
        IFS=: read -r f cfg shp <<<"$c"
        rep=/tmp/ncu_${f}_${cfg}_${shp}
        timeout 120 ncu --section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats \
          --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
          --section InstructionStats --section SourceCounters -k regex:gemm_ --launch-skip 2 --launch-count 1 \
          -f -o "$rep" build/bench_gemm_mma 512 prof "$f" "$cfg" "$shp" >"$out/ncu_run.log" 2>&1 \
          || { tail -20 "$out/ncu_run.log"; continue; }
        { echo "=== format $f tile $cfg $shp"; ncu -i "$rep.ncu-rep" --page details; } >>"$out/ncu.txt" 2>&1
        ncu -i "$rep.ncu-rep" --page source --csv --print-source sass >"$rep.csv" 2>/dev/null
        python3 - "$rep.csv" "format $f tile $cfg $shp" >>"$out/ncu_src.txt" 2>&1 <<'EOF'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr_i = next(i for i, r in enumerate(rows) if any("Source" == c.strip() for c in r))
hdr, body = rows[hdr_i], rows[hdr_i + 1:]
print("===", sys.argv[2], "columns:", hdr)
si = hdr.index("Source")
num = lambda v: float(v.replace(",", "")) if v.replace(",", "").replace(".", "").isdigit() else 0.0
cols = [i for i, h in enumerate(hdr) if "Stall Sampling (All" in h] or [i for i, h in enumerate(hdr) if "Sampling" in h]
if not cols:
    sys.exit(0)
ai = cols[0]
total = sum(num(r[ai]) for r in body if len(r) > ai)
print(f"total samples {total:.0f}")
ops = {}
for r in body:
    if len(r) > ai:
        op = r[si].split()[0] if r[si].split() else "?"
        op = op if not op.startswith("@") else (r[si].split() + ["?"])[1]
        op = op.split(".")[0]
        ops[op] = ops.get(op, 0) + num(r[ai])
print("by opcode:", ", ".join(f"{k} {v / total:.1%}" for k, v in sorted(ops.items(), key=lambda x: -x[1])[:16]))
extra = [i for i, h in enumerate(hdr) if "stall" in h.lower() and i != ai]
for r in sorted((r for r in body if len(r) > ai), key=lambda r: -num(r[ai]))[:40]:
    det = " ".join(f"{hdr[i].split('(')[-1][:24]}={r[i]}" for i in extra if num(r[i]) > 0)[:300]
    print(f"{num(r[ai]) / total:6.2%} {r[si][:70]:70s} {det}")
EOF
      done ;;
    tests)
      module || exit 1
      timeout 300 python3 -m pytest -q -s -p no:cacheprovider tests/cuda/test_backend_cuda.py tests/cuda/test_prefill_gemm.py \
        -k "${TESTS_K:-matmul or gemm or prefill or model_logits or cache_hit}" 2>&1 | tee "$out/pytest.log" | tail -30
      timeout 200 python3 -m pytest -q -p no:cacheprovider tests/native/test_backend_ops.py 2>&1 | tee -a "$out/pytest.log" | tail -5 ;;
    e2e)
      module || exit 1
      PYTHONPATH=. timeout 240 python3 native/kernels/cuda/bench/prefill_ab.py 8b ${E2E_MODELS:-} 2>&1 | tee "$out/ab.log" ;;
  esac
done
module
echo "total: $(( $(date +%s) - t0 )) s"
