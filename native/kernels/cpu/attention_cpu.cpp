// Causal attention over the paged KV pool, one query token × one KV head group at a time.
//
// Exact f32 online softmax over fixed context segments (ops_cpu.h: kAttnSegment) combined in
// order, so a turn served from cached pages gives the same logits as a cold prefill and a
// decode split over threads the same as one thread. Every query head of the group reads
// each K/V row once: G heads share the loads (GQA). f16 and nvfp4 pages are widened a page at a time into a small f32 tile
// (decode dequantises in-kernel; prefill over nvfp4 reads a workspace, see backend_cpu). On AVX2
// decode over nvfp4 pages scores with integer dot products instead (attention_scores_int8).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/cpu/kernels_impl.h"
#include "kvdeck/kernels.h"
#include "kvdeck/ops_cpu.h"

// (No clones under ThreadSanitizer: their ifunc resolvers run before its runtime starts.)
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__SANITIZE_THREAD__)
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

// Widen n token rows of KV head g from the page holding positions tp.. into tile f32 [n, D]
// (tokens at positions >= kv.fresh0 from the fresh f32 rows when given).
static void widen(const KvView& kv, const void* base, const float* fresh, int page, int tp, int g, int n,
                  float* tile) {
  const size_t row = kv_row_bytes(kv.dtype, kv.D);
  const uint8_t* p = static_cast<const uint8_t*>(base) + (size_t(page) * kv.block * kv.nkv + g) * row;
  for (int t = 0; t < n; ++t, p += row * kv.nkv) {
    float* dst = tile + size_t(t) * kv.D;
    if (fresh && tp + t >= kv.fresh0)
      std::memcpy(dst, fresh + size_t(tp + t - kv.fresh0) * kv.fresh_ld + size_t(g) * kv.D, sizeof(float) * kv.D);
    else if (kv.dtype == KvDType::F16)
      f16_to_f32_row(reinterpret_cast<const uint16_t*>(p), dst, kv.D);
    else if (kv.dtype == KvDType::NVFP4)
      kv_nvfp4_decode_row(p, kv.D, dst);
    else
      std::memcpy(dst, p, sizeof(float) * kv.D);
  }
}

// Online softmax over the pages of [t0, t1), the reference order that attention_avx2.cpp
// follows: per page and head, scores, running max / sum update, o = o·alpha + Σ p_t v_t.
void attention_segment_ref(const KvView& kv, int g, const float* q, int G, int t0, int t1, float scale,
                           float* o, float* m, float* l, float* tile) {
  const int B = kv.block, D = kv.D;
  const size_t row = size_t(kv.nkv) * D;  // f32 stride between tokens in a page
  const size_t page_elems = size_t(B) * row;
  const bool f32 = kv.dtype == KvDType::F32 && !kv.fresh_k;  // read in place
  float* ktile = tile;                  // [B, D] widened rows
  float* vtile = tile + size_t(B) * D;  // [B, D]
  float p[256];                         // one page's probabilities (block <= 256)
  for (int h = 0; h < G; ++h) m[h] = -INFINITY, l[h] = 0.0f;
  std::memset(o, 0, sizeof(float) * G * D);
  for (int ps = t0; ps < t1; ps += B) {
    const int n = t1 - ps < B ? t1 - ps : B;
    const int page = kv.pages[ps / B];
    const float *K = ktile, *V = vtile;
    size_t stride = D;
    if (f32) {
      K = static_cast<const float*>(kv.k) + size_t(page) * page_elems + size_t(g) * D;
      V = static_cast<const float*>(kv.v) + size_t(page) * page_elems + size_t(g) * D;
      stride = row;
    } else {
      widen(kv, kv.k, kv.fresh_k, page, ps, g, n, ktile);
      widen(kv, kv.v, kv.fresh_v, page, ps, g, n, vtile);
    }
    for (int h = 0; h < G; ++h) {
      scores_tile(q + size_t(h) * D, 1, D, K, n, stride, scale, p, n);
      float mx = p[0];
      for (int t = 1; t < n; ++t) mx = p[t] > mx ? p[t] : mx;
      const float m_new = mx > m[h] ? mx : m[h];
      const float alpha = flush_exp(m[h] - m_new);  // 0 on the first page (m = -inf)
      float sum = 0.f;
      for (int t = 0; t < n; ++t) sum += (p[t] = flush_exp(p[t] - m_new));
      l[h] = l[h] * alpha + sum;
      m[h] = m_new;
      float* oh = o + size_t(h) * D;
      for (int i = 0; i < D; ++i) oh[i] *= alpha;
      accumulate_tile(p, 1, D, V, n, stride, n, oh);
    }
  }
}

bool attention_scores_int8(const KvView& kv) {
#if defined(__x86_64__)
  static const bool avx2 = cpu_supports("avx2");
  return avx2 && kv.dtype == KvDType::NVFP4 && kv.D % 64 == 0 && kv.D <= 128 && kv.block % 8 == 0 &&
         kv.block <= 64;
#else
  return false;
#endif
}

bool attention_int_v() {
  static const bool on = [] {
    const char* e = std::getenv("KVDECK_ATTN_INT_V");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}

void attention_nvfp4_pv_ref(const uint8_t* v, size_t ts, int n, int D, int G, const float* P, int ldp,
                            const float* alpha, float* o) {
  static const int8_t v2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};  // 2·e2m1
  for (int h = 0; h < G; ++h)
    for (int i = 0; i < D; ++i) o[size_t(h) * D + i] *= alpha[h];
  for (int h = 0; h < G; ++h)
    for (int g0 = 0; g0 < n; g0 += 8) {
      const int g1 = g0 + 8 < n ? g0 + 8 : n;
      for (int b = 0; b < D / 16; ++b) {
        float w[8], wm = 0.0f;
        for (int t = g0; t < g1; ++t) {
          float s = e4m3_to_f32(v[t * ts + D / 2 + b]);
          if (std::isnan(s)) s = 0.0f;
          w[t - g0] = P[size_t(h) * ldp + t] * s;
          wm = std::fabs(w[t - g0]) > wm ? std::fabs(w[t - g0]) : wm;  // (negative only for negative scales)
        }
        const float inv = wm > 0.0f ? 255.0f / wm : 0.0f, f = wm * (0.5f / 255.0f);
        for (int i = 16 * b; i < 16 * b + 16; ++i) {
          int32_t I = 0;
          for (int t = g0; t < g1; ++t) {
            const uint8_t c = (v[t * ts + i / 2] >> (4 * (i & 1))) & 0xF;
            I += int32_t(std::nearbyint(w[t - g0] * inv)) * v2[c];
          }
          float& oi = o[size_t(h) * D + i];
          oi = std::fma(float(I), f, oi);
        }
      }
    }
}

void attention_nvfp4_pv(const uint8_t* v, size_t ts, int n, int D, int G, const float* P, int ldp,
                        const float* alpha, float* o) {
#if defined(__x86_64__)
  static const bool avx2 = cpu_supports("avx2");
  if (avx2 && avx512_active() && attention_nvfp4_pv_avx512(v, ts, n, D, G, P, ldp, alpha, o)) return;
  if (avx2 && attention_nvfp4_pv_avx2(v, ts, n, D, G, P, ldp, alpha, o)) return;
#endif
  attention_nvfp4_pv_ref(v, ts, n, D, G, P, ldp, alpha, o);
}

void attention_segment(const KvView& kv, int g, const float* q, int G, int t0, int t1, float scale,
                       float* o, float* m, float* l, float* tile) {
#if defined(__x86_64__)
  static const bool avx2 = cpu_supports("avx2");
  if (avx2 && kv.D % 8 == 0 && kv.D <= 128 && kv.block <= 64)
    return attention_segment_avx2(kv, g, q, G, t0, t1, scale, o, m, l, tile);
#endif
#if defined(__aarch64__)
  if (neon_active()) return attention_segment_neon(kv, g, q, G, t0, t1, scale, o, m, l, tile);
#endif
  attention_segment_ref(kv, g, q, G, t0, t1, scale, o, m, l, tile);
}

void attention_segment_heads(const KvView& kv, int g0, int g1, const float* q, size_t qg, int G, int t0, int t1,
                             float scale, float* o, size_t og, float* m, float* l, size_t mg, float* tile) {
#if defined(__x86_64__)
  static const bool avx2 = cpu_supports("avx2");
  if (avx2 && kv.D % 8 == 0 && kv.D <= 128 && kv.block <= 64)
    return attention_heads_avx2(kv, g0, g1, q, qg, G, t0, t1, scale, o, og, m, l, mg, tile);
#endif
  for (int g = g0; g < g1; ++g)  // one head at a time through the ISA's segment kernel
    attention_segment(kv, g, q + (g - g0) * qg, G, t0, t1, scale, o + (g - g0) * og, m + (g - g0) * mg,
                      l + (g - g0) * mg, tile);
}

void attention_combine(const float* o, const float* m, const float* l, int S, int G, int D, float* out) {
  for (int h = 0; h < G; ++h) {
    float M = -INFINITY;
    for (int s = 0; s < S; ++s) M = m[s * G + h] > M ? m[s * G + h] : M;
    float L = 0.f;
    float* oh = out + size_t(h) * D;
    std::memset(oh, 0, sizeof(float) * D);
    for (int s = 0; s < S; ++s) {
      const float w = flush_exp(m[s * G + h] - M);
      L += w * l[s * G + h];
      const float* os = o + (size_t(s) * G + h) * D;
      for (int i = 0; i < D; ++i) oh[i] += w * os[i];
    }
    const float inv = 1.0f / L;
    for (int i = 0; i < D; ++i) oh[i] *= inv;
  }
}

void attention_queries(const KvView& kv, int g, const float* q, size_t ldq, int G, int m0, int m1, int p0,
                       float scale, float* out, size_t ldo, float* work) {
  const int D = kv.D, Qn = m1 - m0, seg = attn_segment(kv.block);
  static const int sub = [] {  // (KVDECK_ATTN_SUBTILE: A/B runs)
    const char* e = std::getenv("KVDECK_ATTN_SUBTILE");
    return e && *e ? std::atoi(e) : kAttnSubTile;
  }();
  const int Smax = (p0 + m1 + seg - 1) / seg;
  float* o = work;                                  // [Qn, Smax, G, D]
  float* m = o + size_t(Qn) * Smax * G * D;         // [Qn, Smax, G]
  float* l = m + size_t(Qn) * Smax * G;             // [Qn, Smax, G]
  float* tile = l + size_t(Qn) * Smax * G;          // [2, block, D]
  auto qp = [&](int i) { return q + size_t(m0 + i) * ldq + size_t(g) * G * D; };
  auto ctx_of = [&](int i) { return p0 + m0 + i + 1; };
  auto part = [&](int i, int s, int h) { return size_t(i) * Smax * G + size_t(s) * G + h; };
#if defined(__x86_64__)
  static const bool avx2 = cpu_supports("avx2");
  const bool rows = avx2 && D % 8 == 0 && D <= 128 && kv.block <= 64;
#elif defined(__aarch64__)
  const bool rows = neon_active();  // f32 pages in place (the backend's workspace), else per query
#else
  const bool rows = false;
#endif
  // The rows kernel over segment s, kAttnSubTile queries (x G rows, their q / o in L1) at a
  // time: the sub-tiles walk the segment one after another, so its pages (2·seg·D floats of
  // K and V) come from L2 after the first. A row's arithmetic is the same whatever the split.
  // False when the ISA has no rows kernel for this view (nothing computed).
  thread_local std::vector<const float*> rq;
  thread_local std::vector<float*> ro, rm, rl;
  thread_local std::vector<int> rend;
#if defined(__x86_64__)
  // Not bound to decode's page steps (KvView::decode_order): each segment whole, up to
  // kAttnWideRows rows a call (each chunk of the segment's K is transposed once per call, and
  // its K^T / V rows stay in L1 while every row of the call uses them).
  static const bool wide_on = [] {
    const char* e = std::getenv("KVDECK_ATTN_WIDE");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  const bool wide = rows && wide_on && !kv.decode_order;
#else
  const bool wide = false;
#endif
  const int step = wide ? std::max(1, std::min(Qn, kAttnWideRows / G)) : sub;
  auto rows_segment = [&](int s) {
    const int t0 = s * seg;
    for (int i0 = 0; i0 < Qn; i0 += step) {
      rq.clear(), ro.clear(), rm.clear(), rl.clear(), rend.clear();
      for (int i = i0; i < Qn && i < i0 + step; ++i) {
        const int ctx = ctx_of(i);
        if (ctx <= t0) continue;
        for (int h = 0; h < G; ++h) {
          rq.push_back(qp(i) + size_t(h) * D);
          ro.push_back(o + part(i, s, h) * D);
          rm.push_back(m + part(i, s, h));
          rl.push_back(l + part(i, s, h));
          rend.push_back(ctx < t0 + seg ? ctx : t0 + seg);
        }
      }
      if (rq.empty()) continue;
#if defined(__x86_64__)
      if (wide ? !attention_rows_wide_avx2(kv, g, int(rq.size()), rq.data(), rend.data(), t0, scale, ro.data(),
                                           rm.data(), rl.data())
               : !attention_rows_avx2(kv, g, int(rq.size()), rq.data(), rend.data(), t0, scale, ro.data(),
                                      rm.data(), rl.data(), tile))
        return false;
#elif defined(__aarch64__)
      if (!attention_rows_neon(kv, g, int(rq.size()), rq.data(), rend.data(), t0, scale, ro.data(), rm.data(),
                               rl.data()))
        return false;
#else
      return false;
#endif
    }
    return true;
  };
  for (int s = 0; s < Smax; ++s) {
    const int t0 = s * seg;
    if (rows && rows_segment(s)) continue;
    for (int i = 0; i < Qn; ++i) {  // portable path: one query's segment at a time
      const int ctx = ctx_of(i);
      if (ctx <= t0) continue;
      attention_segment(kv, g, qp(i), G, t0, ctx < t0 + seg ? ctx : t0 + seg, scale, o + part(i, s, 0) * D,
                        m + part(i, s, 0), l + part(i, s, 0), tile);
    }
  }
  for (int i = 0; i < Qn; ++i) {
    const int S = (ctx_of(i) + seg - 1) / seg;
    attention_combine(o + part(i, 0, 0) * D, m + part(i, 0, 0), l + part(i, 0, 0), S, G, D,
                      out + size_t(m0 + i) * ldo + size_t(g) * G * D);
  }
}

void attention_query(const KvView& kv, int g, const float* q, int G, int ctx, float scale, float* out,
                     float* work) {
  const int seg = attn_segment(kv.block), S = (ctx + seg - 1) / seg;
  float* o = work;                                  // [S, G, D]
  float* m = o + size_t(S) * G * kv.D;              // [S, G]
  float* l = m + size_t(S) * G;                     // [S, G]
  float* tile = l + size_t(S) * G;                  // [2, block, D]
  for (int s = 0; s < S; ++s) {
    const int t0 = s * seg, t1 = ctx < t0 + seg ? ctx : t0 + seg;
    attention_segment(kv, g, q, G, t0, t1, scale, o + size_t(s) * G * kv.D, m + s * G, l + s * G, tile);
  }
  attention_combine(o, m, l, S, G, kv.D, out);
}

}  // namespace kvdeck::cpu
