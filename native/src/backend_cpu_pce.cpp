// The CPU backend's KPC4 KV path: see backend_cpu_pce.h. Staging slot layout (kv_pool.h):
// f32 K [L, 16, nkv, D] then V [L, 16, nkv, D]; pool K pages [n_pages][nkv][10 D bytes]
// (kvdeck/kv_pce.h), V rows NVFP4 [n_pages, 16, nkv, D/2 + D/16].
#include "backend_cpu_pce.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kvdeck/kv_pce.h"
#include "kvdeck/ops_cpu.h"

namespace kvdeck::cpu_pce {

namespace {
constexpr int B = cpu::kPceTokens;

const uint8_t* k_head(const KvPool& pool, int layer, int page, int g) {
  return static_cast<const uint8_t*>(pool.k(layer)) +
         (size_t(page) * pool.n_kv() + g) * cpu::kpc4_head_bytes(pool.head_dim());
}
const uint8_t* v_row(const KvPool& pool, int layer, int page, int t, int g) {
  return static_cast<const uint8_t*>(pool.v(layer)) + ((size_t(page) * B + t) * pool.n_kv() + g) * pool.v_row_bytes();
}
float* stage_k(const KvPool& pool, float* slot, int layer) {
  return slot + size_t(layer) * B * pool.n_kv() * pool.head_dim();
}
float* stage_v(const KvPool& pool, float* slot, int layer) {
  return slot + (size_t(pool.n_layers()) + layer) * B * pool.n_kv() * pool.head_dim();
}

// A page written again after its slot was given back (a cancelled chunk had filled it, a later
// forward released it): its rows come back from the pool, so the earlier ones are rounded twice.
void restage(const KvPool& pool, int page, float* slot) {
  const int nkv = pool.n_kv(), D = pool.head_dim();
  const size_t tok = size_t(nkv) * D;
  for (int l = 0; l < pool.n_layers(); ++l)
    for (int g = 0; g < nkv; ++g) {
      cpu::kpc4_decode_page_ref(k_head(pool, l, page, g), D, B, stage_k(pool, slot, l) + size_t(g) * D, tok);
      cpu::nvfp4_rows_ref(v_row(pool, l, page, 0, g), tok / D * pool.v_row_bytes(), B, D,
                          stage_v(pool, slot, l) + size_t(g) * D, tok);
    }
}

// The f32 rows [0, n) of a page, every head in [g0, g1): from the query's own staged page
// (own) or decoded from the pool; rows n..15 zeroed. Head g's row t to k / v + t * ld + (g - g0) * D.
void page_rows(const KvPool& pool, int layer, int page, const float* own, int n, int g0, int g1, float* k, float* v,
               size_t ld, cpu::Kpc4DecodeFn kdec, cpu::Nvfp4RowsFn vdec) {
  const int nkv = pool.n_kv(), D = pool.head_dim();
  const size_t tok = size_t(nkv) * D;
  for (int g = g0; g < g1; ++g) {
    float* kd = k + size_t(g - g0) * D;
    float* vd = v + size_t(g - g0) * D;
    if (own) {
      const float* ks = own + size_t(g) * D;
      const float* vs = own + size_t(pool.n_layers()) * B * tok + size_t(g) * D;  // stage_v over stage_k
      for (int t = 0; t < n; ++t) {
        std::memcpy(kd + t * ld, ks + t * tok, sizeof(float) * D);
        std::memcpy(vd + t * ld, vs + t * tok, sizeof(float) * D);
      }
    } else {
      kdec(k_head(pool, layer, page, g), D, n, kd, ld);
      vdec(v_row(pool, layer, page, 0, g), tok / D * pool.v_row_bytes(), n, D, vd, ld);
    }
    for (int t = n; t < B; ++t) {
      std::memset(kd + t * ld, 0, sizeof(float) * D);
      std::memset(vd + t * ld, 0, sizeof(float) * D);
    }
  }
}

float* thread_buf(State& st, int thread, size_t n) {
  std::vector<float>& v = st.thread_bufs[thread];
  if (v.size() < n) v.resize(n);
  return v.data();
}
}  // namespace

// ============================================================================
// KV write: rows into the staging slots; a page's K encoded when its 16th row is written
// ============================================================================
void kv_write(const KvPool& pool, int layer, const float* k, const float* v, int ld, const int32_t* slots, int M,
              State& st) {
  const int nkv = pool.n_kv(), D = pool.head_dim(), L = pool.n_layers();
  const size_t tok = size_t(nkv) * D, vrow = pool.v_row_bytes();
  st.touched.clear();
  for (int m = 0; m < M; ++m)
    if (st.touched.empty() || st.touched.back() != slots[m] / B) st.touched.push_back(slots[m] / B);
  if (layer == 0) pool.release_retired(st.touched.data(), int(st.touched.size()));
  uint8_t* vb = static_cast<uint8_t*>(pool.v(layer));
  for (int m = 0; m < M; ++m) {
    const int page = slots[m] / B, t = slots[m] % B;
    float* slot = pool.staged(page);
    if (!slot) {
      slot = pool.stage(page);
      if (t > 0) restage(pool, page, slot);
    }
    const float* km = k + size_t(m) * ld;
    const float* vm = v + size_t(m) * ld;
    std::memcpy(stage_k(pool, slot, layer) + t * tok, km, sizeof(float) * tok);
    std::memcpy(stage_v(pool, slot, layer) + t * tok, vm, sizeof(float) * tok);
    for (int g = 0; g < nkv; ++g)
      cpu::kv_nvfp4_encode_row(vm + size_t(g) * D, D, vb + (size_t(slots[m]) * nkv + g) * vrow);
  }
  for (int m = 0; m < M; ++m) {  // pages completed by this call: their K once, from the staged rows
    if (slots[m] % B != B - 1) continue;
    const int page = slots[m] / B;
    const float* ks = stage_k(pool, pool.staged(page), layer);
    for (int g = 0; g < nkv; ++g)
      cpu::kpc4_encode_page(ks + size_t(g) * D, tok, D, const_cast<uint8_t*>(k_head(pool, layer, page, g)));
    if (layer == L - 1) pool.retire(page);
  }
}

// ============================================================================
// Attention
// ============================================================================
void attention(ThreadPool& tp, State& st, const KvPool& pool, int layer, const float* q, int ldq, int M,
               const int32_t* pos, const int32_t* pages, int nh, int nkv, int D, float* out) {
  const int p0 = pos[0], ctx = p0 + M, G = nh / nkv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const size_t tok = size_t(nkv) * D, page_floats = size_t(B) * tok;
  const cpu::Kpc4DecodeFn kdec = cpu::kpc4_decoder(D);
  const cpu::Nvfp4RowsFn vdec = cpu::nvfp4_rows_decoder(D);
  const int P0 = p0 / B, P1 = (ctx - 1) / B;  // the queries' pages
  for (int P = P0; P <= P1; ++P)
    if (!pool.staged(pages[P]))
      throw std::logic_error("kpc4 attention: the queries' page " + std::to_string(pages[P]) + " is not staged");
  if (M == 1) {
    // ---- decode: one task per (segment, KV head) decodes that head's rows of its pages into
    // the thread's buffer (a one-head view: 2 x 16 pages x 16 x D floats, L2-resident) and runs
    // the f32 segment kernel over them; partials combined in segment order.
    const int seg = cpu::attn_segment(B), S = (ctx + seg - 1) / seg, seg_pages = seg / B;
    st.part.resize(size_t(nkv) * S * G * (D + 2));
    float* po = st.part.data();
    float* pm = po + size_t(nkv) * S * G * D;
    float* pl = pm + size_t(nkv) * S * G;
    const float* own = pool.staged(pages[P1]);
    const size_t head_page = size_t(B) * D;  // one head's page in the buffer
    tp.run(S * nkv, [&](int task, int thread) {
      const int s = task / nkv, g = task % nkv;
      const int t0 = s * seg, t1 = std::min(ctx, t0 + seg);
      const int first = t0 / B, np = (t1 - t0 + B - 1) / B;
      float* kb = thread_buf(st, thread, 2 * seg_pages * head_page + 2 * size_t(B) * D);
      float* vb = kb + seg_pages * head_page;
      float* tile = vb + seg_pages * head_page;
      thread_local std::vector<int32_t> lp;  // the segment's page table: lp[first + j] = j
      if (lp.size() < size_t(first + seg_pages)) lp.resize(first + seg_pages);
      for (int j = 0; j < np; ++j) {
        const int P = first + j, n = std::min(B, t1 - P * B);
        lp[first + j] = j;
        page_rows(pool, layer, pages[P], P == P1 ? stage_k(pool, const_cast<float*>(own), layer) : nullptr, n, g,
                  g + 1, kb + j * head_page, vb + j * head_page, size_t(D), kdec, vdec);
      }
      const cpu::KvView view{kb, vb, KvDType::F32, B, 1, D, lp.data()};
      const size_t at = size_t(g) * S + s;
      cpu::attention_segment_heads(view, 0, 1, q + size_t(g) * G * D, size_t(G) * D, G, t0, t1, scale,
                                   po + at * G * D, size_t(S) * G * D, pm + at * G, pl + at * G, size_t(S) * G, tile);
    });
    for (int g = 0; g < nkv; ++g)
      cpu::attention_combine(po + size_t(g) * S * G * D, pm + size_t(g) * S * G, pl + size_t(g) * S * G, S, G, D,
                             out + size_t(g) * G * D);
    return;
  }
  // ---- prefill: the layer's context decoded once (pages [0, P1) from the pool, the queries'
  // pages P0..P1 from staging after them), one page table per query page, whose own entry
  // points at the staged copy; one task per (query page, KV head) over the f32 kernels.
  const int n_rnd = P1, n_own = P1 - P0 + 1;
  st.ws.resize(2 * size_t(n_rnd + n_own) * page_floats);
  float* wk = st.ws.data();
  float* wv = wk + size_t(n_rnd + n_own) * page_floats;
  tp.run(n_rnd + n_own, [&](int j, int) {
    const bool own = j >= n_rnd;
    const int P = own ? P0 + (j - n_rnd) : j, n = std::min(B, ctx - P * B);
    page_rows(pool, layer, pages[P], own ? stage_k(pool, pool.staged(pages[P]), layer) : nullptr, n, 0, nkv,
              wk + j * page_floats, wv + j * page_floats, tok, kdec, vdec);
  });
  st.tables.resize(size_t(n_own) * (P1 + 1));
  for (int i = 0; i < n_own; ++i) {
    int32_t* t = st.tables.data() + size_t(i) * (P1 + 1);
    for (int j = 0; j < P0 + i; ++j) t[j] = j;
    t[P0 + i] = n_rnd + i;
  }
  tp.run(n_own * nkv, [&](int task, int thread) {
    const int i = n_own - 1 - task / nkv, g = task % nkv;  // longest contexts first
    const int P = P0 + i, m0 = std::max(p0, P * B) - p0, m1 = std::min(ctx, P * B + B) - p0;
    const cpu::KvView view{wk, wv, KvDType::F32, B, nkv, D, st.tables.data() + size_t(i) * (P1 + 1)};
    float* work = thread_buf(st, thread, cpu::attention_queries_work_floats(m1 - m0, G, p0 + m1, B, D));
    cpu::attention_queries(view, g, q, size_t(ldq), G, m0, m1, p0, scale, out, size_t(nh) * D, work);
  });
}

}  // namespace kvdeck::cpu_pce
