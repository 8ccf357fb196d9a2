// dispatch.cpp — run-time ISA selection for the CPU kernels (kernels.h).
//
// The best ISA that cpuid reports (avx512vnni > avx2 > scalar) is chosen on first use;
// set_kernel_isa() forces one the CPU supports. ISA-specific code is only ever reached
// through a KernelSet whose cpu_supports() check passed.
#include <atomic>
#include <cstring>
#include <initializer_list>

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
  return nullptr;
}

const cpu::KernelSet* best_kernels() {
  for (const char* name : {"avx512vnni", "avx2", "scalar"})
    if (const cpu::KernelSet* k = kernels_for(name)) return k;
  return &cpu::scalar_kernels();
}

std::atomic<const cpu::KernelSet*>& active() {
  static std::atomic<const cpu::KernelSet*> k{best_kernels()};
  return k;
}

}  // namespace

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

void quantize_act_q8(const float* x, int M, int K, ActQ8& out) {
  active().load(std::memory_order_relaxed)->quantize_act_q8(x, M, K, out);
}

void gemm(const WeightView& w, const float* x, const ActQ8* xq, int M, float* y, int ldy, int n0,
          int n1) {
  if (M <= 0 || n1 <= n0) return;
  const cpu::KernelSet* k = active().load(std::memory_order_relaxed);
  if (w.layout == WeightLayout::Nvfp4X4) {  // repacked at load (repack_nvfp4_x4)
    (k->gemm_nvfp4_x4 ? k->gemm_nvfp4_x4 : cpu::gemm_nvfp4_x4_scalar)(w, *xq, M, y, ldy, n0, n1);
    return;
  }
  k->gemm(w, x, xq, M, y, ldy, n0, n1);
  if (w.dtype == DType::W4A8 && w.mins && !k->gemm_fuses_mins) k->w4a8_mins(w, *xq, M, y, ldy, n0, n1);  // GGUF Q4_1
}

}  // namespace kvdeck
