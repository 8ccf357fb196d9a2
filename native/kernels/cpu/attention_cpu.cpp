// Causal attention over the paged KV pool, one query token × one KV head group at a time.
//
// Exact (two-pass softmax in f32) so a turn served from cached pages gives the same logits
// as a cold prefill. Every query head of the group reads each K/V row once: G heads share
// the loads (GQA). f16 and nvfp4 pages are widened a page at a time into a small f32 tile
// (decode dequantises in-kernel; prefill over nvfp4 reads a workspace, see backend_cpu).
#include <cmath>
#include <cstring>

#include "kvdeck/ops_cpu.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define KV_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define KV_CLONES
#endif

namespace kvdeck::cpu {

// s[h*ld + t] = scale * q[h] · k[t] for t in [0, n)       q: [G, D], k: [n, stride] rows
KV_CLONES static void scores_tile(const float* q, int G, int D, const float* k, int n,
                                  size_t stride, float scale, float* s, int ld) {
  for (int t = 0; t < n; ++t) {
    const float* kt = k + t * stride;
    for (int h = 0; h < G; ++h) {
      const float* qh = q + h * D;
      float acc = 0.f;
#pragma omp simd reduction(+ : acc)
      for (int i = 0; i < D; ++i) acc += qh[i] * kt[i];
      s[h * ld + t] = acc * scale;
    }
  }
}

// out[h] += Σ_t p[h*ld + t] * v[t]                        v: [n, stride] rows, out: [G, D]
KV_CLONES static void accumulate_tile(const float* p, int G, int D, const float* v, int n,
                                      size_t stride, int ld, float* out) {
  for (int t = 0; t < n; ++t) {
    const float* vt = v + t * stride;
    for (int h = 0; h < G; ++h) {
      const float w = p[h * ld + t];
      float* o = out + h * D;
#pragma omp simd
      for (int i = 0; i < D; ++i) o[i] += w * vt[i];
    }
  }
}

// Widen n token rows of KV head g from a page into tile f32 [n, D].
static void widen(const KvView& kv, const void* base, int page, int g, int n, float* tile) {
  const size_t row = kv_row_bytes(kv.dtype, kv.D);
  const uint8_t* p = static_cast<const uint8_t*>(base) + (size_t(page) * kv.block * kv.nkv + g) * row;
  for (int t = 0; t < n; ++t, p += row * kv.nkv) {
    if (kv.dtype == KvDType::F16)
      f16_to_f32_row(reinterpret_cast<const uint16_t*>(p), tile + size_t(t) * kv.D, kv.D);
    else
      kv_nvfp4_decode_row(p, kv.D, tile + size_t(t) * kv.D);
  }
}

void attention_query(const KvView& kv, int g, const float* q, int G, int ctx, float scale, float* out,
                     float* work) {
  const int B = kv.block, D = kv.D;
  const size_t row = size_t(kv.nkv) * D;   // f32 stride between tokens in a page
  const size_t page_elems = size_t(B) * row;
  const bool f32 = kv.dtype == KvDType::F32;
  float* s = work;                                   // [G, ctx] scores, then probabilities
  float* tile = work + static_cast<size_t>(G) * ctx;  // [B, D] widened rows

  // ---- pass 1: scores ----
  for (int p0 = 0, pi = 0; p0 < ctx; p0 += B, ++pi) {
    const int n = ctx - p0 < B ? ctx - p0 : B;
    if (f32) {
      const size_t base = size_t(kv.pages[pi]) * page_elems + size_t(g) * D;
      scores_tile(q, G, D, static_cast<const float*>(kv.k) + base, n, row, scale, s + p0, ctx);
    } else {
      widen(kv, kv.k, kv.pages[pi], g, n, tile);
      scores_tile(q, G, D, tile, n, D, scale, s + p0, ctx);
    }
  }
  // ---- softmax per head ----
  for (int h = 0; h < G; ++h) {
    float* sh = s + static_cast<size_t>(h) * ctx;
    float mx = sh[0];
    for (int t = 1; t < ctx; ++t) mx = sh[t] > mx ? sh[t] : mx;
    float sum = 0.f;
    for (int t = 0; t < ctx; ++t) {
      sh[t] = std::exp(sh[t] - mx);
      sum += sh[t];
    }
    const float inv = 1.0f / sum;
    for (int t = 0; t < ctx; ++t) sh[t] *= inv;
  }
  // ---- pass 2: weighted sum of V ----
  std::memset(out, 0, sizeof(float) * G * D);
  for (int p0 = 0, pi = 0; p0 < ctx; p0 += B, ++pi) {
    const int n = ctx - p0 < B ? ctx - p0 : B;
    if (f32) {
      const size_t base = size_t(kv.pages[pi]) * page_elems + size_t(g) * D;
      accumulate_tile(s + p0, G, D, static_cast<const float*>(kv.v) + base, n, row, ctx, out);
    } else {
      widen(kv, kv.v, kv.pages[pi], g, n, tile);
      accumulate_tile(s + p0, G, D, tile, n, D, ctx, out);
    }
  }
}

}  // namespace kvdeck::cpu
