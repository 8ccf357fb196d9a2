// kernel_check_neon.h — what kernel_check_neon.cpp and kernel_check_neon_attention.cpp share:
// the check callback, one random stream (the checks draw from it in a fixed order, so the inputs
// do not depend on how the checks are split into files) and small helpers.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvdeck/kernels.h"

namespace kvdeck::neon_check {

using CheckFn = void (*)(bool, const std::string&);
extern CheckFn g_check;  // set by check_neon_vs_scalar
extern std::mt19937 rng;
inline float normal() { return std::normal_distribution<float>(0.0f, 1.0f)(rng); }
inline int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }
inline uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline int bits_differ(const std::vector<float>& a, const std::vector<float>& b) {
  int n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += bits(a[i]) != bits(b[i]);
  return n;
}

// Runs f() with the named kernel set active.
template <typename F>
void with(const char* isa, F f) {
  set_kernel_isa(isa);
  f();
}

void check_attention();  // kernel_check_neon_attention.cpp: f32 / f16 / nvfp4 pages, prefill == decode

}  // namespace kvdeck::neon_check
