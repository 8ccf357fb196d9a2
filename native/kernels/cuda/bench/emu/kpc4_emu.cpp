// kpc4_emu.cpp — the KPC4 CUDA kernels' own source (kv_write_kpc4.cu, attention_kpc4.cu) run on
// the CPU through emu.h: the KV write (staging, NVFP4 V rows, K pages encoded when full) and the
// pages-to-f32 decoder byte for byte against the CPU codec (kv_codec_pce.cpp, kv_codec_cpu.cpp),
// and decode attention against a float64 softmax over the rows as the CPU decodes them (the
// query's own page unrounded, as the CPU backend reads it from staging). With an argument DIR,
// each decode case's inputs and output go to DIR/decode_N.bin for tests/native/
// test_cuda_kpc4_emu.py to run through the CPU backend's kpc4 attention. One PASS / FAIL line
// per check; exit status 0 only if all pass.
#define KVDECK_CUDA_EMU 1
#include "emu.h"

#include "../../attention_combine.cu"
#include "../../attention_kpc4.cu"
#include "../../kv_write_kpc4.cu"
#include "kvdeck/kv_pce.h"
#include "kvdeck/ops_cpu.h"

#include <cstdio>
#include <map>
#include <random>
#include <string>

namespace kvdeck::cuda::detail {
bool pdl_supported() { return false; }  // common.cuh's; launch_kernel is compiled, never called here
}  // namespace kvdeck::cuda::detail

namespace {

namespace kc = kvdeck::cuda;
namespace cpu = kvdeck::cpu;

int g_fail = 0, g_checks = 0;
std::string g_dump;
int g_cases = 0;

void report(const std::string& name, double err, double bound) {
  const bool ok = std::isfinite(err) && err <= bound;
  ++g_checks, g_fail += !ok;
  std::printf("%s %-60s err %.2e (bound %.0e)\n", ok ? "PASS" : "FAIL", name.c_str(), err, bound);
}

// ---- a pool of L layers as the GPU path writes it (host memory: emu.h's device) -------------
struct Pool {
  int L, nkv, D, n_pages;
  size_t vrow, tok;
  std::vector<std::vector<uint8_t>> k, v;  // [L] pages
  std::map<int, std::vector<float>> slot;  // page -> staging slot f32 K [L][16][nkv][D], V the same
  Pool(int L_, int nkv_, int D_, int n_pages_) : L(L_), nkv(nkv_), D(D_), n_pages(n_pages_) {
    vrow = size_t(D) / 2 + D / 16, tok = size_t(nkv) * D;
    for (int l = 0; l < L; ++l) {
      k.emplace_back(size_t(n_pages) * nkv * kc::kpc4_head_bytes(D), 0);
      v.emplace_back(size_t(n_pages) * 16 * nkv * vrow, 0);
    }
  }
  float* stage_k(int page, int l) {
    auto& s = slot[page];
    if (s.empty()) s.assign(2 * size_t(L) * 16 * tok, 0.0f);
    return s.data() + size_t(l) * 16 * tok;
  }
  // kv_write of layer l: rows [M][nkv*D] to slots, through the two kernels
  void write(int l, const float* kr, const float* vr, int M, const std::vector<int32_t>& slots) {
    std::vector<float*> rows(M);
    std::vector<const float*> full_src;
    std::vector<int32_t> full_pages;
    for (int m = 0; m < M; ++m) {
      const int page = slots[m] / 16, t = slots[m] % 16;
      rows[m] = stage_k(page, l) + size_t(t) * tok;
      if (t == 15) full_src.push_back(stage_k(page, l)), full_pages.push_back(page);
    }
    kc::Kpc4Write w;
    w.k_pages = k[l].data(), w.v_pages = v[l].data(), w.n_kv = nkv, w.D = D, w.slots = slots.data();
    w.stage_rows = rows.data(), w.v_off = size_t(L) * 16 * tok;
    w.n_full = int(full_pages.size()), w.full_src = full_src.data(), w.full_pages = full_pages.data();
    const int items = M * nkv * (D / 16);
    emu::launch(dim3(unsigned((items + 127) / 128)), 128, [&] { kc::kpc4_stage_kernel(w, kr, vr, int(tok), M); });
    if (w.n_full) {
      const int e = w.n_full * nkv * (D / 2);
      emu::launch(dim3(unsigned((e + 127) / 128)), 128, [&] { kc::kpc4_encode_kernel(w); });
    }
  }
};

// K rows with what the codec must get right: channels of one mean plus slow drift (post-RoPE
// K), a constant channel (step 0), one beyond E4M3's range (saturation), one in E4M3's
// subnormals, negative-only and mixed-sign channels; V normal with row amplitudes, a zero block.
void make_rows(std::mt19937& rng, int ctx, int nkv, int D, std::vector<float>& k, std::vector<float>& v) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> un(-4.f, 4.f);
  const size_t tok = size_t(nkv) * D;
  k.resize(size_t(ctx) * tok), v.resize(size_t(ctx) * tok);
  std::vector<float> mean(tok), amp(tok);
  for (size_t i = 0; i < tok; ++i) mean[i] = un(rng), amp[i] = 0.05f + std::abs(nd(rng));
  for (int t = 0; t < ctx; ++t)
    for (size_t i = 0; i < tok; ++i) {
      const int c = int(i % D);
      float x = mean[i] + amp[i] * nd(rng);
      if (c == 3) x = 1.25f;                              // constant: step 0, codes 0
      if (c == 5) x = 600.0f + 100.0f * nd(rng);          // beyond 448
      if (c == 6) x = 1e-3f * nd(rng);                    // E4M3 subnormal lo / step
      if (c == 7) x = -2.0f - std::abs(nd(rng));          // negative only
      k[size_t(t) * tok + i] = x;
      const float a = 0.3f + float(t % 7);
      v[size_t(t) * tok + i] = (c >= 16 && c < 32 && t % 5 == 0) ? 0.0f : a * nd(rng);
    }
}

// ---- the codec: GPU write (in chunks) vs the CPU codec on the same rows ----------------------
void codec_case(int nkv, int D, int ctx, const std::vector<int>& chunks) {
  std::mt19937 rng(17 + ctx + D * 3 + nkv);
  const int n_pages = (ctx + 15) / 16 + 2, L = 2, l = 1;
  std::vector<float> k, v;
  make_rows(rng, ctx, nkv, D, k, v);
  std::vector<int32_t> pages(n_pages);
  for (int i = 0; i < n_pages; ++i) pages[i] = n_pages - 1 - i;  // not identity
  Pool P(L, nkv, D, n_pages);
  const size_t tok = P.tok;
  int done = 0;
  for (int c : chunks) {
    std::vector<int32_t> slots(c);
    for (int m = 0; m < c; ++m) slots[m] = pages[(done + m) / 16] * 16 + (done + m) % 16;
    P.write(l, &k[size_t(done) * tok], &v[size_t(done) * tok], c, slots);
    done += c;
  }
  // CPU codec
  size_t bad_k = 0, bad_v = 0, bad_s = 0;
  std::vector<uint8_t> ref(kc::kpc4_head_bytes(D)), vr(P.vrow);
  for (int pi = 0; pi < done / 16; ++pi)
    for (int g = 0; g < nkv; ++g) {
      cpu::kpc4_encode_page(&k[size_t(pi) * 16 * tok + size_t(g) * D], tok, D, ref.data());
      const uint8_t* got = &P.k[l][(size_t(pages[pi]) * nkv + g) * kc::kpc4_head_bytes(D)];
      for (size_t b = 0; b < ref.size(); ++b) bad_k += got[b] != ref[b];
    }
  for (int t = 0; t < done; ++t)
    for (int g = 0; g < nkv; ++g) {
      cpu::kv_nvfp4_encode_row(&v[size_t(t) * tok + size_t(g) * D], D, vr.data());
      const uint8_t* got = &P.v[l][((size_t(pages[t / 16]) * 16 + t % 16) * nkv + g) * P.vrow];
      for (size_t b = 0; b < P.vrow; ++b) bad_v += got[b] != vr[b];
      const float* sk = P.stage_k(pages[t / 16], l) + size_t(t % 16) * tok + size_t(g) * D;
      const float* sv = sk + size_t(L) * 16 * tok;
      for (int d = 0; d < D; ++d)
        bad_s += sk[d] != k[size_t(t) * tok + size_t(g) * D + d] || sv[d] != v[size_t(t) * tok + size_t(g) * D + d];
    }
  char name[128];
  std::snprintf(name, sizeof name, "codec K pages nkv=%d D=%d ctx=%d chunks=%zu", nkv, D, ctx, chunks.size());
  report(name, double(bad_k), 0);
  std::snprintf(name, sizeof name, "codec V rows nkv=%d D=%d ctx=%d", nkv, D, ctx);
  report(name, double(bad_v), 0);
  std::snprintf(name, sizeof name, "codec staging rows nkv=%d D=%d ctx=%d", nkv, D, ctx);
  report(name, double(bad_s), 0);
  // pages -> f32 (prefill / restaging) against the CPU decoders
  const int nf = done / 16;
  std::vector<float> wk(size_t(nf) * 16 * tok, NAN), wv(wk.size(), NAN), rk(D), rv(D);
  const size_t items = size_t(nf) * 16 * nkv * (D / 2);
  emu::launch(dim3(unsigned((items + 255) / 256)), 256, [&] {
    kc::kpc4_pages_f32_kernel(P.k[l].data(), P.v[l].data(), pages.data(), nf, nkv, D, wk.data(), wv.data());
  });
  size_t bad_d = 0;
  for (int pi = 0; pi < nf; ++pi)
    for (int g = 0; g < nkv; ++g) {
      std::vector<float> kk(16 * size_t(D));
      cpu::kpc4_decode_page_ref(&P.k[l][(size_t(pages[pi]) * nkv + g) * kc::kpc4_head_bytes(D)], D, 16, kk.data(), D);
      for (int t = 0; t < 16; ++t) {
        cpu::kv_nvfp4_decode_row(&P.v[l][((size_t(pages[pi]) * 16 + t) * nkv + g) * P.vrow], D, rv.data());
        const size_t o = ((size_t(pi) * 16 + t) * nkv + g) * D;
        for (int d = 0; d < D; ++d)
          bad_d += std::memcmp(&wk[o + d], &kk[size_t(t) * D + d], 4) != 0 || std::memcmp(&wv[o + d], &rv[d], 4) != 0;
      }
    }
  std::snprintf(name, sizeof name, "codec pages to f32 nkv=%d D=%d ctx=%d", nkv, D, ctx);
  report(name, double(bad_d), 0);
}

// ---- decode attention ------------------------------------------------------------------------
template <int D, int G>
void decode_case(int nkv, int ctx, int max_ctx, double bound) {
  std::mt19937 rng(101 + ctx * 7 + D + G * 13);
  const int nh = nkv * G, n_pages = (max_ctx + 15) / 16, L = 1;
  std::vector<float> k, v, q(size_t(nh) * D);
  make_rows(rng, ctx, nkv, D, k, v);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& x : q) x = nd(rng);
  std::vector<int32_t> pages(n_pages);
  for (int i = 0; i < n_pages; ++i) pages[i] = i;
  std::shuffle(pages.begin(), pages.end(), rng);
  Pool P(L, nkv, D, n_pages);
  const size_t tok = P.tok;
  auto slots_of = [&](int t0, int n) {
    std::vector<int32_t> s(n);
    for (int m = 0; m < n; ++m) s[m] = pages[(t0 + m) / 16] * 16 + (t0 + m) % 16;
    return s;
  };
  if (ctx > 1) P.write(0, k.data(), v.data(), ctx - 1, slots_of(0, ctx - 1));  // a prefill, then the step's row
  P.write(0, &k[size_t(ctx - 1) * tok], &v[size_t(ctx - 1) * tok], 1, slots_of(ctx - 1, 1));
  const int split = kc::attn_split_tokens(max_ctx), n_splits = kc::attn_splits(max_ctx);
  std::vector<float> ws(kc::attn_workspace_floats(nh, max_ctx, D), NAN), out(q.size(), NAN);
  const int32_t ctx_dev = ctx;
  const float scale = float(1.0 / std::sqrt(double(D))), sl2 = scale * 1.4426950408889634f;
  emu::launch(dim3(unsigned(nkv), unsigned(n_splits)), 128, [&] {
    kc::kpc4_mma_kernel<D, G>(P.k[0].data(), P.v[0].data(), pages.data(), nkv, q.data(), &ctx_dev, split, n_splits,
                              n_pages, sl2, ws.data());
  });
  const float* own = P.stage_k(pages[(ctx - 1) / 16], 0);
  emu::launch(dim3(unsigned(nh)), 128, [&] {
    kc::kpc4_combine_kernel(ws.data(), &ctx_dev, split, n_splits, D, G, nkv, q.data(), own, own + 16 * tok, sl2,
                            out.data());
  });
  // float64 reference: pooled pages as the CPU decodes them, the own page unrounded
  const int pooled = (ctx - 1) / 16 * 16;
  std::vector<float> kd(size_t(ctx) * tok), vd(kd.size());
  for (int t = 0; t < ctx; ++t)
    for (int g = 0; g < nkv; ++g) {
      const size_t o = size_t(t) * tok + size_t(g) * D;
      if (t >= pooled) {
        std::memcpy(&kd[o], &k[o], 4 * D), std::memcpy(&vd[o], &v[o], 4 * D);
        continue;
      }
      std::vector<float> kk(16 * size_t(D));
      cpu::kpc4_decode_page_ref(&P.k[0][(size_t(pages[t / 16]) * nkv + g) * kc::kpc4_head_bytes(D)], D, 16, kk.data(),
                                D);
      std::memcpy(&kd[o], &kk[size_t(t % 16) * D], 4 * D);
      cpu::kv_nvfp4_decode_row(&P.v[0][((size_t(pages[t / 16]) * 16 + t % 16) * nkv + g) * P.vrow], D, &vd[o]);
    }
  double num = 0, den = 0;
  for (int h = 0; h < nh; ++h) {
    const int g = h / G;
    std::vector<double> s(ctx);
    double mx = -INFINITY;
    for (int t = 0; t < ctx; ++t) {
      double d = 0;
      for (int c = 0; c < D; ++c) d += double(q[size_t(h) * D + c]) * kd[size_t(t) * tok + size_t(g) * D + c];
      s[t] = d / std::sqrt(double(D)), mx = std::max(mx, s[t]);
    }
    double z = 0;
    for (auto& x : s) z += (x = std::exp(x - mx));
    for (int c = 0; c < D; ++c) {
      double o = 0;
      for (int t = 0; t < ctx; ++t) o += s[t] * vd[size_t(t) * tok + size_t(g) * D + c];
      o /= z;
      const double got = out[size_t(h) * D + c];
      num = std::isfinite(got) ? std::max(num, std::abs(got - o)) : INFINITY;
      den = std::max(den, std::abs(o));
    }
  }
  char name[128];
  std::snprintf(name, sizeof name, "decode kpc4 ctx=%d/%d h=%d/%d D=%d", ctx, max_ctx, nh, nkv, D);
  report(name, num / std::max(den, 1e-30), bound);
  if (!g_dump.empty()) {  // inputs and output for the CPU backend's kpc4 attention (the test)
    const std::string path = g_dump + "/decode_" + std::to_string(g_cases++) + ".bin";
    FILE* f = std::fopen(path.c_str(), "wb");
    const int32_t hdr[4] = {ctx, nkv, nh, D};
    std::fwrite(hdr, 4, 4, f);
    std::fwrite(q.data(), 4, q.size(), f);
    std::fwrite(k.data(), 4, k.size(), f);
    std::fwrite(v.data(), 4, v.size(), f);
    std::fwrite(out.data(), 4, out.size(), f);
    std::fclose(f);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) g_dump = argv[1];
  // codec: pages completed across write calls (a prefill chunk, decode rows), D 64 / 128
  codec_case(2, 64, 53, {20, 13, 1, 1, 18});
  codec_case(3, 128, 48, {48});
  codec_case(1, 128, 40, {7, 9, 16, 8});
  // decode: own page only, a full own page, several splits with a partial last page, G 1 / 3 / 4 / 8
  decode_case<64, 3>(3, 1, 64, 3e-3);
  decode_case<64, 3>(3, 16, 64, 3e-3);
  decode_case<128, 4>(2, 17, 300, 3e-3);
  decode_case<128, 4>(2, 300, 300, 3e-3);
  decode_case<64, 1>(2, 200, 700, 3e-3);
  decode_case<128, 8>(1, 1000, 4096, 3e-3);
  decode_case<64, 3>(3, 2305, 2400, 3e-3);
  std::printf("%s: %d of %d checks passed\n", g_fail ? "FAIL" : "PASS", g_checks - g_fail, g_checks);
  return g_fail ? 1 : 0;
}
