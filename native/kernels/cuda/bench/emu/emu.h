// emu.h — a host emulation of the CUDA execution model, enough to run the attention kernels'
// own source on a CPU (no GPU was lent in session 5): every thread of a block is an OS thread;
// __syncthreads is a block barrier; warp collectives (shuffles, votes, movmatrix, mma.sync m16n8k16 f16,
// ldmatrix x4 [.trans]) exchange the 32 lanes' operands through per-warp slots between two
// warp barriers and compute what the PTX ISA's fragment layouts say each lane receives;
// __shared__ variables are function statics (one block runs at a time). Device memory is host
// memory. Include before the kernel sources, compile with KVDECK_CUDA_EMU defined (the asm
// wrappers in common.cuh / attention_*.cu take their emulated branch), C++20.
#pragma once
#ifndef KVDECK_CUDA_EMU
#error "define KVDECK_CUDA_EMU"
#endif
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace emu {

struct Warp {
  std::barrier<> bar{32};
  uint32_t u[32][8];
  const void* p[32];
};

struct Block {
  explicit Block(int threads) : all(threads), warps(threads / 32) {
    for (auto& w : warps) w = std::make_unique<Warp>();
  }
  std::barrier<> all;
  std::vector<std::unique_ptr<Warp>> warps;
};

inline thread_local uint3 tl_tid, tl_bid;
inline thread_local Block* tl_block = nullptr;
inline uint3 g_bdim, g_gdim;
inline std::mutex g_atomic;

inline int lane() { return int(tl_tid.x & 31); }
inline Warp& warp() { return *tl_block->warps[tl_tid.x / 32]; }

// Run `body` as a grid of blocks of `threads` threads, one block at a time.
inline void launch(dim3 grid, int threads, const std::function<void()>& body) {
  g_gdim = uint3{grid.x, grid.y, grid.z};
  g_bdim = uint3{unsigned(threads), 1, 1};
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        Block blk(threads);
        std::vector<std::thread> th;
        th.reserve(threads);
        for (int t = 0; t < threads; ++t)
          th.emplace_back([&, t] {
            tl_tid = uint3{unsigned(t), 0, 0};
            tl_bid = uint3{x, y, z};
            tl_block = &blk;
            body();
          });
        for (auto& t : th) t.join();
      }
}

// One collective: every lane publishes n words, then reads what it needs.
template <class F>
inline void exchange(const uint32_t* in, int n, F&& read) {
  Warp& w = warp();
  std::memcpy(w.u[lane()], in, sizeof(uint32_t) * n);
  w.bar.arrive_and_wait();
  read(w);
  w.bar.arrive_and_wait();
}

template <class T>
inline T shfl(T v, int src) {
  static_assert(sizeof(T) <= 32);
  uint32_t in[8] = {};
  std::memcpy(in, &v, sizeof(T));
  T r;
  exchange(in, 8, [&](Warp& w) { std::memcpy(&r, w.u[src & 31], sizeof(T)); });
  return r;
}

inline float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }

// mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 (PTX ISA fragment layouts; g = lane / 4,
// t = lane % 4): a0 (g, 2t..), a1 (g + 8, 2t..), a2 (g, 2t + 8..), a3 (g + 8, 2t + 8..);
// b0 (k 2t.., n g), b1 (k 2t + 8.., n g); c0, c1 (g, 2t..), c2, c3 (g + 8, 2t..).
inline void mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  const uint32_t in[6] = {a0, a1, a2, a3, b0, b1};
  const int l = lane(), g = l / 4, t = l % 4;
  float out[4];
  exchange(in, 6, [&](Warp& w) {
    auto A = [&](int r, int k) {  // element (r, k) of A
      const int ln = (r % 8) * 4 + (k % 8) / 2, reg = (r / 8) + 2 * (k / 8);
      return h2f(uint16_t(w.u[ln][reg] >> (16 * (k & 1))));
    };
    auto B = [&](int k, int n) {
      const int ln = n * 4 + (k % 8) / 2, reg = 4 + k / 8;
      return h2f(uint16_t(w.u[ln][reg] >> (16 * (k & 1))));
    };
    for (int e = 0; e < 4; ++e) {
      const int r = g + 8 * (e / 2), n = 2 * t + (e & 1);
      double acc = 0;
      for (int k = 0; k < 16; ++k) acc += double(A(r, k)) * double(B(k, n));
      out[e] = float(double(c[e]) + acc);
    }
  });
  for (int e = 0; e < 4; ++e) c[e] = out[e];
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lanes 8i..8i+7 give the row addresses of
// matrix i; register i of lane l gets matrix i's (row l / 4, cols 2 (l % 4), +1), or with
// .trans its (rows 2 (l % 4), +1, col l / 4).
inline void ldsm_x4(uint32_t (&r)[4], const void* p, bool trans) {
  Warp& w = warp();
  const int l = lane();
  w.p[l] = p;
  w.bar.arrive_and_wait();
  for (int i = 0; i < 4; ++i) {
    if (!trans) {
      std::memcpy(&r[i], static_cast<const uint8_t*>(w.p[8 * i + l / 4]) + 4 * (l % 4), 4);
    } else {
      uint16_t lo, hi;
      std::memcpy(&lo, static_cast<const uint8_t*>(w.p[8 * i + 2 * (l % 4)]) + 2 * (l / 4), 2);
      std::memcpy(&hi, static_cast<const uint8_t*>(w.p[8 * i + 2 * (l % 4) + 1]) + 2 * (l / 4), 2);
      r[i] = uint32_t(lo) | uint32_t(hi) << 16;
    }
  }
  w.bar.arrive_and_wait();
}

// movmatrix.sync.aligned.m8n8.trans.b16: lane l gets (M[2 (l % 4)][l / 4], M[2 (l % 4) + 1][l / 4])
// where lane r * 4 + c / 2 holds M[r][c] (half c % 2).
inline uint32_t movmatrix_trans(uint32_t x) {
  const int l = lane();
  uint32_t r = 0;
  exchange(&x, 1, [&](Warp& w) {
    for (int h = 0; h < 2; ++h) {
      const int row = 2 * (l % 4) + h, col = l / 4;
      r |= ((w.u[row * 4 + col / 2][0] >> (16 * (col % 2))) & 0xFFFFu) << (16 * h);
    }
  });
  return r;
}

// prmt.b32 in its generic mode: bytes of {b, a}, a selector nibble's bit 3 replicates the sign.
inline uint32_t prmt(uint32_t a, uint32_t b, uint32_t s) {
  const uint64_t x = uint64_t(b) << 32 | a;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t n = (s >> (4 * i)) & 0xFu;
    uint32_t byte = uint32_t(x >> (8 * (n & 7u))) & 0xFFu;
    if (n & 8u) byte = (byte & 0x80u) ? 0xFFu : 0u;
    r |= byte << (8 * i);
  }
  return r;
}

}  // namespace emu

// ---- the CUDA names the kernels use ------------------------------------------------------------
#undef __shared__
#define __shared__ static
#define threadIdx emu::tl_tid
#define blockIdx emu::tl_bid
#define __launch_bounds__(...)
#define __syncthreads() emu::tl_block->all.arrive_and_wait()
#define __syncwarp(...) emu::warp().bar.arrive_and_wait()  // the warp's barrier (attention_kpc4.cu)
#define __forceinline__ inline

// A vector load from an address its type does not align faults on the GPU (misaligned
// address, a sticky error): the emulation stops there too.
template <class T>
inline T __ldg(const T* p) {
  if (reinterpret_cast<uintptr_t>(p) % alignof(T) != 0) {
    std::fprintf(stderr, "FAIL misaligned __ldg: %zu-byte load at %p\n", sizeof(T), static_cast<const void*>(p));
    std::abort();
  }
  return *p;
}
// The f32 intrinsics with a fixed rounding (never contracted on the GPU; no contraction here either).
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
template <class T>
inline T __shfl_xor_sync(unsigned, T v, int o) {
  return emu::shfl(v, emu::lane() ^ o);
}
template <class T>
inline T __shfl_sync(unsigned, T v, int src) {
  return emu::shfl(v, src);
}
inline int __any_sync(unsigned, int pred) {
  const uint32_t in = pred != 0;
  int any = 0;
  emu::exchange(&in, 1, [&](emu::Warp& w) {
    for (int i = 0; i < 32; ++i) any |= int(w.u[i][0]);
  });
  return any;
}
inline int atomicMax(int* p, int v) {
  std::lock_guard<std::mutex> g(emu::g_atomic);
  const int o = *p;
  *p = std::max(o, v);
  return o;
}
inline uint32_t __funnelshift_r(uint32_t lo, uint32_t hi, uint32_t sh) {
  return uint32_t(((uint64_t(hi) << 32) | lo) >> (sh & 31u));
}
inline uint32_t __float_as_uint(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
using std::max;
using std::min;
