// dispatch.cpp — run-time ISA selection for the CPU kernels (kernels.h).
//
// The best ISA that cpuid reports (avx512vnni > avx2 > scalar) is chosen on first use;
// set_kernel_isa() forces one the CPU supports. ISA-specific code is only ever reached
// through a KernelSet whose cpu_supports() check passed.
// aarch64: neon (asimd + dot product, from getauxval(AT_HWCAP)) > scalar.
// KVDECK_ISA=<name> in the environment picks the first set instead of the best one (tests:
// KVDECK_ISA=scalar runs the portable kernels on a CPU that has a faster set); a name the
// CPU cannot run is reported on stderr and the best set is used.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <stdexcept>
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD (1 << 1)
#endif
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#endif

#include "kernels/cpu/kernels_impl.h"

namespace kvdeck {
namespace {

const cpu::KernelSet* kernels_for(const char* name) {
  if (!cpu_supports(name)) return nullptr;
  if (std::strcmp(name, "scalar") == 0) return &cpu::scalar_kernels();
#if defined(__x86_64__)
  if (std::strcmp(name, "avx2") == 0) return &cpu::avx2_kernels();
  if (std::strcmp(name, "avx512vnni") == 0) return &cpu::avx512_kernels();
#endif
#if defined(__aarch64__)
  if (std::strcmp(name, "neon") == 0) return &cpu::neon_kernels();
#endif
  return nullptr;
}

const cpu::KernelSet* best_kernels() {
  for (const char* name : {"avx512vnni", "avx2", "neon", "scalar"})
    if (const cpu::KernelSet* k = kernels_for(name)) return k;
  return &cpu::scalar_kernels();
}

const cpu::KernelSet* first_kernels() {
  const char* env = std::getenv("KVDECK_ISA");
  if (env == nullptr || *env == '\0') return best_kernels();
  if (const cpu::KernelSet* k = kernels_for(env)) return k;
  const cpu::KernelSet* best = best_kernels();
  std::fprintf(stderr, "kvdeck: KVDECK_ISA=%s is not a kernel set this CPU runs; using %s\n", env, best->name);
  return best;
}

std::atomic<const cpu::KernelSet*>& active() {
  static std::atomic<const cpu::KernelSet*> k{first_kernels()};
  return k;
}

}  // namespace

#if defined(__x86_64__)
bool cpu::avx512_active() {  // (avx512_kernels() lives in an AVX-512 file: not called without the CPU for it)
  static const bool can = cpu_supports("avx512vnni");
  return can && active().load(std::memory_order_relaxed) == &cpu::avx512_kernels();
}
#endif
#if defined(__aarch64__)
bool cpu::neon_active() { return active().load(std::memory_order_relaxed) == &cpu::neon_kernels(); }
#endif

bool cpu_supports(const char* name) {
  if (name == nullptr) return false;
  if (std::strcmp(name, "scalar") == 0) return true;
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c");
  if (std::strcmp(name, "avx2") == 0) return avx2;
  if (std::strcmp(name, "avx512vnni") == 0)
    return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vnni");
#endif
#if defined(__aarch64__)
  if (std::strcmp(name, "neon") == 0) {
#if defined(__linux__)
    const unsigned long hw = getauxval(AT_HWCAP);
    return (hw & HWCAP_ASIMD) && (hw & HWCAP_ASIMDDP);
#else
    return false;  // no getauxval: the portable kernels
#endif
  }
#endif
  return false;
}

const char* kernel_isa() { return active().load(std::memory_order_relaxed)->name; }

const cpu::KernelSet& cpu::active_kernels() { return *active().load(std::memory_order_relaxed); }

bool set_kernel_isa(const char* name) {
  const cpu::KernelSet* k = kernels_for(name);
  if (k == nullptr) return false;
  active().store(k, std::memory_order_relaxed);
  return true;
}

WeightLayout preferred_layout(const WeightView& w) {
  return w.dtype == DType::NVFP4 ? cpu::active_kernels().nvfp4_layout : WeightLayout::File;
}

WeightLayout preferred_layout_a16(const WeightView& w) {
  const bool q41 = w.dtype == DType::W4A8 && w.mins && w.group == kQ8Block;
  return q41 ? cpu::active_kernels().q41_a16_layout : WeightLayout::File;
}

void quantize_act_q8(const float* x, int M, int K, ActQ8& out) {
  const cpu::KernelSet* k = active().load(std::memory_order_relaxed);
  if (out.q16)  // 16-bit activations (gemm_a16.cpp)
    (k->quantize_act_q16 ? k->quantize_act_q16 : cpu::quantize_act_q16_scalar)(x, M, K, out);
  else
    k->quantize_act_q8(x, M, K, out);
}

void gemm(const WeightView& w, const float* x, const ActQ8* xq, int M, float* y, int ldy, int n0,
          int n1) {
  if (M <= 0 || n1 <= n0) return;
  const cpu::KernelSet* k = active().load(std::memory_order_relaxed);
  if (xq && xq->q16 && is_integer(w.dtype)) {  // 16-bit activations: W4A8 / W8A8 only (else throws)
    (k->gemm_a16 ? k->gemm_a16 : cpu::gemm_a16_scalar)(w, *xq, M, y, ldy, n0, n1);
    return;
  }
  if (w.layout == WeightLayout::Q41X8)  // repacked for 16-bit activations (repack_q4_1_x8)
    throw std::invalid_argument("gemm: GGUF Q4_1 weights repacked for activations a16 (layout Q41X8) need 16-bit activations");
  if (w.layout == WeightLayout::Nvfp4X4) {  // repacked at load (repack_nvfp4_x4)
    (k->gemm_nvfp4_x4 ? k->gemm_nvfp4_x4 : cpu::gemm_nvfp4_x4_scalar)(w, *xq, M, y, ldy, n0, n1);
    return;
  }
  k->gemm(w, x, xq, M, y, ldy, n0, n1);
  if (w.dtype == DType::W4A8 && w.mins && !k->gemm_fuses_mins) k->w4a8_mins(w, *xq, M, y, ldy, n0, n1);  // GGUF Q4_1
}

}  // namespace kvdeck
