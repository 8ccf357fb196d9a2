// bench_attention_kpc4.cu — decode attention over KPC4 pages (attention_kpc4.cuh): validation
// against a float64 softmax and timing at 4K / 16K / 32K (Llama-3-8B: 32 query heads, 8 KV
// heads, D 128, page table shuffled), next to bench_attention.cu's f16 / nvfp4 rows of the same
// run (the issue-12 ratio: kpc4 / f16 at 32K). The pages are written by the GPU's own KV write
// (kpc4_kv_write: byte for byte the CPU codec, tests/native/test_cuda_kpc4_emu.py and
// tests/cuda/test_kpc4_cuda.py); the reference reads them back through kpc4_pages_to_f32 (the
// CPU decoder's values, same tests), the query's own page unrounded from staging.
#include "attention_kpc4.cuh"
#include "bench_common.h"
#include "kernels_cuda.h"

namespace bench {

namespace kc = kvdeck::cuda;

namespace {

void run_kpc4(Options& o, int nh, int nkv, int D, int ctx, int max_ctx, bool time) {
  const int B = 16, n_pages = (ctx + B - 1) / B, G = nh / nkv;
  const size_t tok = size_t(nkv) * D, kbytes = size_t(n_pages) * nkv * kc::kpc4_head_bytes(D);
  const size_t vrow = size_t(D) / 2 + D / 16, vbytes = size_t(n_pages) * B * nkv * vrow;
  Rng rng(4242 + ctx * 3 + D);
  std::vector<int32_t> pages(n_pages);
  for (int i = 0; i < n_pages; ++i) pages[i] = i;
  for (int i = n_pages - 1; i > 0; --i) std::swap(pages[i], pages[rng.next() % uint64_t(i + 1)]);
  // K: a mean per channel plus drift (post-RoPE K's shape, what the format is for); V normal
  std::vector<float> k(size_t(ctx) * tok), v(k.size()), mean(tok), q(size_t(nh) * D);
  for (auto& m : mean) m = 6.0f * rng.uniform() - 3.0f;
  for (int t = 0; t < ctx; ++t)
    for (size_t i = 0; i < tok; ++i) k[t * tok + i] = mean[i] + 0.5f * rng.normal(), v[t * tok + i] = rng.normal();
  for (auto& x : q) x = rng.normal();
  // staging for every page (one layer: V at + 16 tok), row pointers, the full pages
  float* stage = dalloc<float>(size_t(n_pages) * 2 * B * tok);
  std::vector<float*> rows(ctx);
  std::vector<const float*> full_src;
  std::vector<int32_t> full_pages, slots(ctx);
  for (int t = 0; t < ctx; ++t) {
    const int p = pages[t / B];
    slots[t] = p * B + t % B;
    rows[t] = stage + (size_t(p) * 2 * B + t % B) * tok;
    if (t % B == B - 1) full_src.push_back(stage + size_t(p) * 2 * B * tok), full_pages.push_back(p);
  }
  uint8_t* dk0 = dalloc<uint8_t>(kbytes);
  uint8_t* dv0 = dalloc<uint8_t>(vbytes);
  float *dkr = dupload(k), *dvr = dupload(v), *dq = dupload(q);
  int32_t *dslots = dupload(slots), *dfull = dupload(full_pages);
  float** drows = dupload(rows);
  const float** dsrc = dupload(full_src);
  kc::Kpc4Write w;
  w.k_pages = dk0, w.v_pages = dv0, w.n_kv = nkv, w.D = D, w.slots = dslots, w.stage_rows = drows;
  w.v_off = size_t(B) * tok, w.n_full = int(full_pages.size()), w.full_src = dsrc, w.full_pages = dfull;
  CK(kc::kpc4_kv_write(w, dkr, dvr, int(tok), ctx, 0));
  // reference rows: the pooled pages decoded, the own page as written
  const int pooled = (ctx - 1) / B * B;
  float *dwk = dalloc<float>(size_t(n_pages) * B * tok), *dwv = dalloc<float>(size_t(n_pages) * B * tok);
  std::vector<int32_t> table(pages);
  table.resize((max_ctx + B - 1) / B, 0);
  int32_t* dpages = dupload(table);
  CK(kc::kpc4_pages_to_f32(dk0, dv0, dpages, pooled / B, nkv, D, dwk, dwv, 0));
  std::vector<float> kd = ddownload(dwk, size_t(ctx) * tok), vd = ddownload(dwv, size_t(ctx) * tok);
  for (size_t i = size_t(pooled) * tok; i < size_t(ctx) * tok; ++i) kd[i] = k[i], vd[i] = v[i];
  std::vector<double> ref(q.size(), 0.0), s(ctx);
  const float scale = 1.0f / std::sqrt(float(D));
  for (int h = 0; h < nh; ++h) {
    const int g = h / G;
    double mx = -1e300, sum = 0;
    for (int t = 0; t < ctx; ++t) {
      double a = 0;
      for (int i = 0; i < D; ++i) a += double(q[size_t(h) * D + i]) * kd[t * tok + size_t(g) * D + i];
      s[t] = a * scale, mx = std::max(mx, s[t]);
    }
    for (int t = 0; t < ctx; ++t) sum += (s[t] = std::exp(s[t] - mx));
    for (int t = 0; t < ctx; ++t)
      for (int i = 0; i < D; ++i) ref[size_t(h) * D + i] += s[t] / sum * vd[t * tok + size_t(g) * D + i];
  }
  // device copies of the layer for timing past L2 (the own page's staging shared: 16 rows)
  const int layers = time ? copies_for(o, double(kbytes + vbytes)) : 1;
  std::vector<uint8_t*> dk(layers, dk0), dv(layers, dv0);
  for (int l = 1; l < layers; ++l) {
    dk[l] = dalloc<uint8_t>(kbytes), dv[l] = dalloc<uint8_t>(vbytes);
    CK(cudaMemcpy(dk[l], dk0, kbytes, cudaMemcpyDeviceToDevice));
    CK(cudaMemcpy(dv[l], dv0, vbytes, cudaMemcpyDeviceToDevice));
  }
  const float* own = stage + size_t(pages[(ctx - 1) / B]) * 2 * B * tok;
  const std::vector<int32_t> ctxv = {ctx};
  int32_t* dctx = dupload(ctxv);
  float* dout = dalloc<float>(q.size());
  float* dws = dalloc<float>(kc::attn_workspace_floats(nh, max_ctx, D));
  auto run = [&](int l, cudaStream_t st) {
    return kc::kpc4_attention_decode(dk[l], dv[l], dpages, nkv, D, dq, nh, dctx, max_ctx, scale, own, own + B * tok,
                                     dws, dout, st);
  };
  CK(cudaMemset(dout, 0xFF, q.size() * 4));  // poison
  CK(run(0, 0));
  CK(cudaDeviceSynchronize());
  const auto out = ddownload(dout, q.size());
  const ErrStats e = compare(out.data(), ref.data(), out.size());
  char sh[96];
  std::snprintf(sh, sizeof sh, "ctx=%d/%d h=%d/%d D=%d", ctx, max_ctx, nh, nkv, D);
  add_validation("attn_kpc4_mma vs f64", sh, e.max_abs, e.rel_max, e.rel_norm, 3e-3);
  if (time) {
    const double bytes = double(kbytes + vbytes) + 2.0 * q.size() * 4 + n_pages * 4.0;
    const double us = time_us(o, layers, [&](int l, cudaStream_t st) { run(l, st); });
    char tsh[64];
    std::snprintf(tsh, sizeof tsh, "ctx=%d", ctx);
    add_timing(o, "attn_kpc4_mma", tsh, us, bytes);
  }
  for (int l = 1; l < layers; ++l) {
    CK(cudaFree(dk[l]));
    CK(cudaFree(dv[l]));
  }
  for (void* p : {static_cast<void*>(stage), static_cast<void*>(dk0), static_cast<void*>(dv0),
                  static_cast<void*>(dkr), static_cast<void*>(dvr), static_cast<void*>(dq), static_cast<void*>(dslots),
                  static_cast<void*>(dfull), static_cast<void*>(drows), static_cast<void*>(dsrc),
                  static_cast<void*>(dwk), static_cast<void*>(dwv), static_cast<void*>(dpages),
                  static_cast<void*>(dctx), static_cast<void*>(dout), static_cast<void*>(dws)})
    CK(cudaFree(p));
}

}  // namespace

void bench_attention_kpc4(Options& o) {
  // the own page alone, one pooled page, a grid sized past ctx, SmolLM2's 9/3 at D 64, several splits
  run_kpc4(o, 32, 8, 128, 1, 1, false);
  run_kpc4(o, 32, 8, 128, 17, 17, false);
  run_kpc4(o, 32, 8, 128, 300, 4096, false);
  run_kpc4(o, 9, 3, 64, 1000, 1000, false);
  run_kpc4(o, 32, 8, 128, 9000, 9000, false);
  if (o.quick) return;
  for (int ctx : {4096, 16384, 32768}) run_kpc4(o, 32, 8, 128, ctx, ctx, true);
}

}  // namespace bench
