// attn_emu.cpp — the tensor-core attention kernels' own source (attention_prefill.cu,
// attention_mma.cu) run on the CPU through emu.h, against a float64 softmax over the rows as the
// CPU codecs decode them (kv_codec_cpu.cpp): prefill (f16 / NVFP4 / f32 / NVFP4R / K8V4 pages,
// with and without the chunk's own rows unrounded, q hi + lo and q f16) and the decode split
// kernel (NVFP4, NVFP4R, K8V4), with tails in rows, tokens and splits, and the split combine
// (attention_combine.cu) writing the o projection's q8.
// Prints one PASS / FAIL line per check; exit status 0 only if all pass. Built and run by
// tests/native/test_cuda_attention_emu.py (g++ -std=c++20, the CUDA headers, no GPU).
#define KVDECK_CUDA_EMU 1
#include "emu.h"

#include "../../attention_combine.cu"
#include "../../attention_mma.cu"
#include "../../attention_prefill.cu"
#include "kvdeck/kv_pool.h"
#include "kvdeck/ops_cpu.h"

#include <cstdio>
#include <cstring>
#include <random>
#include <string>

namespace kvdeck::cuda::detail {
bool pdl_supported() { return false; }  // gemv.cu's; launch_kernel is compiled, never called here
}  // namespace kvdeck::cuda::detail

namespace {

namespace kc = kvdeck::cuda;
using kvdeck::KvDType;

int g_fail = 0, g_checks = 0;

void report(const std::string& name, double err, double bound) {
  const bool ok = std::isfinite(err) && err <= bound;
  ++g_checks, g_fail += !ok;
  std::printf("%s %-58s rel %.2e (bound %.0e)\n", ok ? "PASS" : "FAIL", name.c_str(), err, bound);
}

double rel_err(const std::vector<float>& got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num = std::max(num, std::abs(double(got[i]) - ref[i]));
    den = std::max(den, std::abs(ref[i]));
  }
  return num / std::max(den, 1e-30);
}

size_t row_bytes(KvDType t, int D, bool v) {
  switch (t) {
    case KvDType::F32: return size_t(D) * 4;
    case KvDType::F16: return size_t(D) * 2;
    case KvDType::NVFP4: return size_t(D) / 2 + D / 16;
    case KvDType::NVFP4R: return size_t(D) / 2 + D / 16 + 2;
    default: return v ? size_t(D) / 2 + D / 16 + 2 : size_t(D) + 2;
  }
}

// A paged layer: K / V pools (pages shuffled), the f32 rows and their decoded values.
struct Layer {
  int B = 16, ctx, n_kv, D;
  KvDType t;
  std::vector<int32_t> pages;
  std::vector<uint8_t> k, v;
  std::vector<float> kf, vf, kd, vd;  // [ctx, n_kv, D]: the rows, and as the pool decodes them
  Layer(KvDType t_, int ctx_, int n_kv_, int D_, int max_ctx, std::mt19937& rng, int B_ = 16)
      : B(B_), ctx(ctx_), n_kv(n_kv_), D(D_), t(t_) {
    const int n_pages = (max_ctx + B - 1) / B;
    pages.resize(n_pages);
    for (int i = 0; i < n_pages; ++i) pages[i] = i;
    std::shuffle(pages.begin(), pages.end(), rng);
    const size_t rk = row_bytes(t, D, false), rv = row_bytes(t, D, true), n = size_t(ctx) * n_kv * D;
    k.assign(size_t(n_pages) * B * n_kv * rk, 0), v.assign(size_t(n_pages) * B * n_kv * rv, 0);
    kf.resize(n), vf.resize(n), kd.resize(n), vd.resize(n);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::uniform_real_distribution<float> amp(0.2f, 3.0f);
    for (int tk = 0; tk < ctx; ++tk)
      for (int g = 0; g < n_kv; ++g) {
        const float a = amp(rng);  // row magnitudes that differ token to token (row scales)
        const size_t i = (size_t(tk) * n_kv + g) * D, slot = (size_t(pages[tk / B]) * B + tk % B) * n_kv + g;
        for (int d = 0; d < D; ++d) kf[i + d] = a * nd(rng), vf[i + d] = nd(rng);
        kvdeck::cpu::kv_encode_row(t, false, &kf[i], D, &k[slot * rk]);
        kvdeck::cpu::kv_encode_row(t, true, &vf[i], D, &v[slot * rv]);
        kvdeck::cpu::kv_decode_row(t, false, &k[slot * rk], D, &kd[i]);
        kvdeck::cpu::kv_decode_row(t, true, &v[slot * rv], D, &vd[i]);
      }
  }
};

// float64 softmax(scale q . k) v of query row qr (head h) over tokens [0, n); tokens >= f0 use
// the unrounded rows.
void ref_row(const Layer& L, const float* qr, int h, int G, int n, int f0, double* out) {
  const int g = h / G, D = L.D;
  const double scale = 1.0 / std::sqrt(double(D));
  std::vector<double> s(n);
  double mx = -1e300, sum = 0;
  for (int t = 0; t < n; ++t) {
    const float* kr = (t >= f0 ? L.kf.data() : L.kd.data()) + (size_t(t) * L.n_kv + g) * D;
    double a = 0;
    for (int d = 0; d < D; ++d) a += double(qr[d]) * kr[d];
    s[t] = a * scale, mx = std::max(mx, s[t]);
  }
  for (int t = 0; t < n; ++t) sum += (s[t] = std::exp(s[t] - mx));
  for (int d = 0; d < D; ++d) out[d] = 0;
  for (int t = 0; t < n; ++t) {
    const float* vr = (t >= f0 ? L.vf.data() : L.vd.data()) + (size_t(t) * L.n_kv + g) * D;
    for (int d = 0; d < D; ++d) out[d] += s[t] / sum * vr[d];
  }
}

// ---- prefill --------------------------------------------------------------------------------------

template <kc::KvFormat F, int D, bool QS>
void prefill_case(int nh, int n_kv, int M, int p0, bool fresh, double bound) {
  std::mt19937 rng(11 + M * 7 + p0 + D + static_cast<int>(F) * 3 + fresh + QS * 5);
  const int ctx = p0 + M, G = nh / n_kv, KD = n_kv * D;
  Layer L(KvDType(static_cast<int>(F)), ctx, n_kv, D, ctx, rng);
  std::vector<float> q(size_t(M) * nh * D), out(q.size(), NAN);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& x : q) x = nd(rng);
  std::vector<int32_t> pos(M);
  for (int m = 0; m < M; ++m) pos[m] = p0 + m;
  const float* fk = fresh ? L.kf.data() + size_t(p0) * KD : nullptr;
  const float* fv = fresh ? L.vf.data() + size_t(p0) * KD : nullptr;
  const float sl2 = float(1.0 / std::sqrt(double(D))) * 1.4426950408889634f;
  emu::launch(dim3(unsigned((M * G + 63) / 64), unsigned(n_kv)), 128, [&] {
    kc::attn_prefill_kernel<F, D, QS>(L.k.data(), L.v.data(), L.pages.data(), L.B, n_kv, q.data(), nh * D, M, G,
                                      pos.data(), sl2, out.data(), nh * D, fk, fv, KD);
  });
  std::vector<double> ref(q.size());
  for (int m = 0; m < M; ++m)
    for (int h = 0; h < nh; ++h)
      ref_row(L, &q[(size_t(m) * nh + h) * D], h, G, pos[m] + 1, fresh ? p0 : 1 << 30, &ref[(size_t(m) * nh + h) * D]);
  char name[160];
  const char* fn = F == kc::KvFormat::F32 ? "f32" : F == kc::KvFormat::F16 ? "f16" : F == kc::KvFormat::NVFP4 ? "nvfp4"
                   : F == kc::KvFormat::NVFP4R ? "nvfp4r" : "k8v4";
  std::snprintf(name, sizeof name, "prefill %s%s%s M=%d p0=%d h=%d/%d D=%d", fn,
                fresh ? " fresh" : "", QS ? "" : " q16", M, p0, nh, n_kv, D);
  report(name, rel_err(out, ref), bound);
}

// ---- decode (split kernel + the combine's formula) ---------------------------------------------

// B: tokens per page
template <kc::KvFormat F, int D, int G>
void decode_case(int n_kv, int ctx, int max_ctx, double bound, int B = 16) {
  std::mt19937 rng(5 + ctx * 3 + D + static_cast<int>(F) * 11 + G + 1);
  const int nh = n_kv * G;
  Layer L(KvDType(static_cast<int>(F)), ctx, n_kv, D, max_ctx, rng, B);
  std::vector<float> q(size_t(nh) * D);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& x : q) x = nd(rng);
  const int split = kc::attn_split_tokens(max_ctx), n_splits = kc::attn_splits(max_ctx);
  const int n_pt = (max_ctx + L.B - 1) / L.B;
  std::vector<float> ws(kc::attn_workspace_floats(nh, max_ctx, D), NAN);
  const int32_t ctx_dev = ctx;
  const float sl2 = float(1.0 / std::sqrt(double(D))) * 1.4426950408889634f;
  emu::launch(dim3(unsigned(n_kv), unsigned(n_splits)), 128, [&] {
    kc::attn_mma_kernel<F, D, G, 1>(L.k.data(), L.v.data(), L.pages.data(), L.B, n_kv, q.data(), &ctx_dev, split,
                                    n_splits, n_pt, sl2, ws.data(), kc::detail::AttnTail{});
  });
  std::vector<float> out(q.size());
  const int live = (ctx + split - 1) / split;
  for (int h = 0; h < nh; ++h) {
    const float* p = &ws[size_t(h) * n_splits * (D + 2)];
    double mx = -INFINITY;
    for (int s = 0; s < live; ++s) mx = std::max(mx, double(p[s * (D + 2) + D]));
    double den = 0;
    for (int s = 0; s < live; ++s) den += std::exp2(p[s * (D + 2) + D] - mx) * p[s * (D + 2) + D + 1];
    for (int d = 0; d < D; ++d) {
      double num = 0;
      for (int s = 0; s < live; ++s) num += std::exp2(p[s * (D + 2) + D] - mx) * p[s * (D + 2) + d];
      out[size_t(h) * D + d] = float(num / den);
    }
  }
  std::vector<double> ref(q.size());
  for (int h = 0; h < nh; ++h) ref_row(L, &q[size_t(h) * D], h, G, ctx, 1 << 30, &ref[size_t(h) * D]);
  static const char* names[] = {"f32", "f16", "nvfp4", "nvfp4r", "k8v4"};
  char name[160];
  std::snprintf(name, sizeof name, "decode %s ctx=%d/%d h=%d/%d D=%d B=%d", names[static_cast<int>(F)], ctx,
                max_ctx, nh, n_kv, D, B);
  report(name, rel_err(out, ref), bound);
  // the combine kernel itself, writing the o projection's q8 too: out as the formula above (f32
  // sums in another order), q / d / s exactly quantize_act_q8's of the out it wrote
  const int K = nh * D;
  std::vector<float> cout(K, NAN), qd(K / 32, NAN);
  std::vector<int8_t> qq(K, 99);
  std::vector<int32_t> qs(K / 32, -1);
  const kc::ActQ8Out q8{qq.data(), qd.data(), qs.data()};
  emu::launch(dim3(unsigned(nh), unsigned(D / 32)), kc::kCombineThreads, [&] {
    kc::attn_combine_kernel(ws.data(), &ctx_dev, split, n_splits, D, cout.data(), kc::detail::AttnFresh{}, q8, true);
  });
  std::vector<double> formula(out.begin(), out.end());
  size_t bad = 0;
  for (int b = 0; b < K / 32; ++b) {  // kernels_cuda.h quantize_act_q8's contract
    float amax = 0.f;
    int sum = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(cout[b * 32 + i]));
    const float id = amax > 0.f ? 127.0f / amax : 0.f;
    for (int i = 0; i < 32; ++i) {
      const int qi = int(std::fmax(-127.0f, std::fmin(127.0f, std::rint(cout[b * 32 + i] * id))));
      sum += qi, bad += qq[b * 32 + i] != qi;
    }
    bad += qd[b] != amax / 127.0f, bad += qs[b] != sum;
  }
  std::snprintf(name, sizeof name, "combine+q8 %s ctx=%d/%d h=%d/%d D=%d B=%d", names[static_cast<int>(F)], ctx,
                max_ctx, nh, n_kv, D, B);
  report(name, bad ? INFINITY : rel_err(cout, formula), 1e-5);
}

// The fused kernel (attention_impl.cuh: one block of kAttnFusedSplits x 4 warps per KV head runs
// every split and the combine): out and its q8 bit-identical to the split kernel + combine kernel
// pair's, with and without the fresh token (rotated in the tail, as in the combine).
template <kc::KvFormat F, int D, int G>
void fused_case(int n_kv, int ctx, int max_ctx, bool fresh, bool with_q8, int B = 16) {
  std::mt19937 rng(17 + ctx * 5 + D + G + fresh);
  const int nh = n_kv * G, K = nh * D;
  Layer L(KvDType(static_cast<int>(F)), std::max(ctx, 1), n_kv, D, max_ctx, rng, B);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> q(K), fk(n_kv * D), fv(n_kv * D), inv(D / 2);
  for (auto& x : q) x = nd(rng);
  for (auto& x : fk) x = nd(rng);
  for (auto& x : fv) x = nd(rng);
  for (int i = 0; i < D / 2; ++i) inv[i] = float(std::pow(10000.0, -2.0 * i / D));
  const int32_t ctx_dev = ctx, rpos = ctx;
  const int split = kc::attn_split_tokens(max_ctx), n_splits = kc::attn_splits(max_ctx);
  const int n_pt = (max_ctx + L.B - 1) / L.B;
  const float sl2 = float(1.0 / std::sqrt(double(D))) * 1.4426950408889634f;
  const kc::detail::AttnFresh f{fresh ? q.data() : nullptr, fresh ? fk.data() : nullptr, fresh ? fv.data() : nullptr,
                                sl2, G, fresh ? &rpos : nullptr, fresh ? inv.data() : nullptr};
  struct Res {
    std::vector<float> out, d;
    std::vector<int8_t> q;
    std::vector<int32_t> s;
  } r[2];
  for (int v = 0; v < 2; ++v) {
    r[v] = {std::vector<float>(K, NAN), std::vector<float>(K / 32, NAN), std::vector<int8_t>(K, 99),
            std::vector<int32_t>(K / 32, -1)};
    const kc::ActQ8Out q8 = with_q8 ? kc::ActQ8Out{r[v].q.data(), r[v].d.data(), r[v].s.data()} : kc::ActQ8Out{};
    std::vector<float> ws(kc::attn_workspace_floats(nh, max_ctx, D), NAN);
    if (v == 0) {
      emu::launch(dim3(unsigned(n_kv), unsigned(n_splits)), 128, [&] {
        kc::attn_mma_kernel<F, D, G, 1>(L.k.data(), L.v.data(), L.pages.data(), L.B, n_kv, q.data(), &ctx_dev, split,
                                        n_splits, n_pt, sl2, ws.data(), kc::detail::AttnTail{});
      });
      emu::launch(dim3(unsigned(nh), unsigned(D / 32)), kc::kCombineThreads, [&] {
        kc::attn_combine_kernel(ws.data(), &ctx_dev, split, n_splits, D, r[v].out.data(), f, q8, true);
      });
    } else {
      const kc::detail::AttnTail tail{r[v].out.data(), f, q8, true};
      emu::launch(dim3(unsigned(n_kv)), 128 * kc::detail::kAttnFusedSplits, [&] {
        kc::attn_mma_kernel<F, D, G, kc::detail::kAttnFusedSplits>(L.k.data(), L.v.data(), L.pages.data(), L.B, n_kv,
                                                                   q.data(), &ctx_dev, split, n_splits, n_pt, sl2,
                                                                   ws.data(), tail);
      });
    }
  }
  size_t bad = 0;
  for (int i = 0; i < K; ++i) bad += std::memcmp(&r[0].out[i], &r[1].out[i], 4) != 0 || !std::isfinite(r[1].out[i]);
  if (with_q8) {
    for (int i = 0; i < K; ++i) bad += r[0].q[i] != r[1].q[i];
    for (int b = 0; b < K / 32; ++b) bad += std::memcmp(&r[0].d[b], &r[1].d[b], 4) != 0 || r[0].s[b] != r[1].s[b];
  }
  static const char* names[] = {"f32", "f16", "nvfp4", "nvfp4r", "k8v4"};
  char name[160];
  std::snprintf(name, sizeof name, "fused == split+combine %s ctx=%d/%d h=%d/%d D=%d%s%s", names[static_cast<int>(F)],
                ctx, max_ctx, nh, n_kv, D, fresh ? " fresh" : "", with_q8 ? " q8" : "");
  report(name, double(bad), 0.0);
}

}  // namespace

int main() {
  using kc::KvFormat;
  // prefill: 64-row tiles with tails (M G = 96, 45, 45), 64-token tiles with tails, fresh rows
  prefill_case<KvFormat::F16, 128, true>(8, 2, 24, 100, false, 2e-3);
  prefill_case<KvFormat::F16, 128, false>(8, 2, 24, 50, false, 5e-3);
  prefill_case<KvFormat::NVFP4, 128, true>(8, 2, 24, 100, true, 3e-3);
  prefill_case<KvFormat::NVFP4, 64, true>(9, 3, 15, 70, false, 2e-3);
  prefill_case<KvFormat::F16, 64, true>(9, 3, 15, 0, true, 3e-3);
  prefill_case<KvFormat::NVFP4, 64, true>(5, 1, 9, 3, true, 3e-3);
  prefill_case<KvFormat::F16, 64, true>(2, 2, 64, 40, false, 2e-3);  // G 1: warp 0 skips the second tile
  // f32 rows rounded to f16, the row-scaled formats (2-byte aligned rows)
  prefill_case<KvFormat::F32, 128, true>(8, 2, 24, 100, false, 3e-3);
  prefill_case<KvFormat::NVFP4R, 128, true>(8, 2, 24, 100, true, 3e-3);
  prefill_case<KvFormat::NVFP4R, 64, true>(9, 3, 15, 70, false, 3e-3);
  prefill_case<KvFormat::K8V4, 128, true>(8, 2, 24, 100, false, 3e-3);
  prefill_case<KvFormat::K8V4, 64, true>(9, 3, 15, 70, true, 3e-3);
  // decode: a partial chunk, several splits with a partial last one, G 4 / 3, D 128 / 64
  decode_case<KvFormat::NVFP4, 128, 4>(2, 300, 300, 2e-3);
  decode_case<KvFormat::NVFP4, 64, 3>(3, 200, 700, 2e-3);
  decode_case<KvFormat::NVFP4R, 128, 4>(2, 300, 300, 2e-3);
  decode_case<KvFormat::NVFP4R, 64, 3>(3, 130, 500, 2e-3);
  decode_case<KvFormat::K8V4, 128, 4>(2, 300, 300, 2e-3);
  decode_case<KvFormat::K8V4, 64, 3>(3, 17, 17, 2e-3);
  // many chunks a warp (split 640: 10 per warp; the last live split's warps partial or empty);
  // pages of 32 (the chunk cursor wrapping every second chunk)
  decode_case<KvFormat::NVFP4, 128, 4>(1, 3000, 40000, 2e-3);
  decode_case<KvFormat::NVFP4, 128, 4>(2, 1000, 20000, 2e-3, 32);
  decode_case<KvFormat::NVFP4, 64, 3>(1, 1500, 30000, 2e-3, 32);
  decode_case<KvFormat::NVFP4R, 128, 4>(1, 2990, 40000, 2e-3);
  decode_case<KvFormat::K8V4, 64, 3>(1, 1500, 30000, 2e-3, 32);
  // the fused kernel (max_ctx <= 4 splits of 64): live splits 1 / 3 / 4 of 4, a partial chunk, fresh
  // tokens (ctx 0: the fresh token alone), with and without the q8, G 4 / 3 / 1, D 128 / 64
  fused_case<KvFormat::NVFP4, 128, 4>(2, 17, 256, true, true);
  fused_case<KvFormat::NVFP4, 128, 4>(2, 150, 256, false, true);
  fused_case<KvFormat::NVFP4, 128, 4>(1, 256, 256, true, false);
  fused_case<KvFormat::NVFP4, 64, 3>(3, 70, 200, false, true);
  fused_case<KvFormat::NVFP4, 64, 1>(2, 0, 64, true, true);
  std::printf("%s: %d of %d checks passed\n", g_fail ? "FAIL" : "PASS", g_checks - g_fail, g_checks);
  return g_fail ? 1 : 0;
}
