// bench_attention.cu — paged decode attention: validation against a float64 softmax over the
// rows as the CPU codecs decode them, and timing at 4K / 16K / 32K context (Llama-3-8B:
// 32 query heads, 8 KV heads, D = 128, pages of 16 tokens, page table shuffled).
#include "bench_common.h"
#include "attention_impl.cuh"
#include "kernels_cuda.h"
#include "kvdeck/formats.h"
#include "kvdeck/ops_cpu.h"

namespace bench {

namespace kc = kvdeck::cuda;

namespace {

struct AttnCase {
  int n_heads, n_kv, D, ctx, max_ctx;
  kc::KvFormat fmt;
  bool time;
  bool profile = false;  // one launch of the default kernel, nothing checked (for ncu)
  float amp = 1.0f;      // row magnitude (1/128: NVFP4 products below f16's normal range in the MMAs)
};

// Any pool format (kv_pool.h): a K (v = false) or V row's bytes, and the CPU codec of it.
size_t kv_bytes(kc::KvFormat f, int D, bool v) {
  switch (f) {
    case kc::KvFormat::F32: return size_t(D) * 4;
    case kc::KvFormat::F16: return size_t(D) * 2;
    case kc::KvFormat::NVFP4: return size_t(D) / 2 + D / 16;
    case kc::KvFormat::NVFP4R: return size_t(D) / 2 + D / 16 + 2;
    default: return v ? size_t(D) / 2 + D / 16 + 2 : size_t(D) + 2;
  }
}
const char* fmt_name(kc::KvFormat f) {
  return f == kc::KvFormat::F32 ? "f32" : f == kc::KvFormat::F16 ? "f16" : f == kc::KvFormat::NVFP4 ? "nvfp4" : f == kc::KvFormat::NVFP4R ? "nvfp4r" : "k8v4";
}

void run_case(Options& o, const AttnCase& c) {
  const int B = 16, n_pages = (c.ctx + B - 1) / B, G = c.n_heads / c.n_kv;
  const size_t rk = kv_bytes(c.fmt, c.D, false), rv = kv_bytes(c.fmt, c.D, true);
  const size_t kbytes = size_t(n_pages) * B * c.n_kv * rk, vbytes = size_t(n_pages) * B * c.n_kv * rv;
  const char* fname = fmt_name(c.fmt);
  const auto dt = kvdeck::KvDType(int(c.fmt));
  Rng rng(1000 + c.ctx * 3 + int(c.fmt) + c.D);

  // page table: a shuffled permutation of the pool's pages
  std::vector<int32_t> pages(n_pages);
  for (int i = 0; i < n_pages; ++i) pages[i] = i;
  for (int i = n_pages - 1; i > 0; --i) std::swap(pages[i], pages[rng.next() % uint64_t(i + 1)]);
  // K, V pools (host), filled token by token through the page table
  std::vector<uint8_t> hk(kbytes, 0), hv(vbytes, 0);
  std::vector<float> xk(c.D), xv(c.D);
  for (int t = 0; t < c.ctx; ++t)
    for (int g = 0; g < c.n_kv; ++g) {
      // rows of varied magnitude (the row scales of nvfp4r / k8v4 differ token to token)
      const float amp = c.amp * (c.fmt == kc::KvFormat::NVFP4R || c.fmt == kc::KvFormat::K8V4 ? 0.25f + 4.0f * rng.uniform() : 1.0f);
      for (int i = 0; i < c.D; ++i) xk[i] = amp * (4.0f * rng.uniform() - 2.0f), xv[i] = amp * (4.0f * rng.uniform() - 2.0f);
      const size_t slot = (size_t(pages[t / B]) * B + t % B) * c.n_kv + g;
      kvdeck::cpu::kv_encode_row(dt, false, xk.data(), c.D, &hk[slot * rk]);
      kvdeck::cpu::kv_encode_row(dt, true, xv.data(), c.D, &hv[slot * rv]);
    }
  std::vector<float> q(size_t(c.n_heads) * c.D);
  for (auto& v : q) v = rng.normal();
  const float scale = 1.0f / std::sqrt(float(c.D));

  // float64 reference over the decoded rows
  std::vector<double> ref(q.size(), 0.0);
  if (!c.profile) {
    std::vector<float> kd(size_t(c.ctx) * c.D), vd(size_t(c.ctx) * c.D);
    std::vector<double> s(c.ctx);
    for (int g = 0; g < c.n_kv; ++g) {
      for (int t = 0; t < c.ctx; ++t) {
        const size_t slot = (size_t(pages[t / B]) * B + t % B) * c.n_kv + g;
        kvdeck::cpu::kv_decode_row(dt, false, &hk[slot * rk], c.D, &kd[size_t(t) * c.D]);
        kvdeck::cpu::kv_decode_row(dt, true, &hv[slot * rv], c.D, &vd[size_t(t) * c.D]);
      }
      for (int j = 0; j < G; ++j) {
        const int h = g * G + j;
        double mx = -1e300, sum = 0;
        for (int t = 0; t < c.ctx; ++t) {
          double a = 0;
          for (int i = 0; i < c.D; ++i) a += double(q[size_t(h) * c.D + i]) * kd[size_t(t) * c.D + i];
          s[t] = a * scale;
          mx = std::max(mx, s[t]);
        }
        for (int t = 0; t < c.ctx; ++t) sum += (s[t] = std::exp(s[t] - mx));
        for (int t = 0; t < c.ctx; ++t)
          for (int i = 0; i < c.D; ++i) ref[size_t(h) * c.D + i] += s[t] / sum * vd[size_t(t) * c.D + i];
      }
    }
  }

  // device: `layers` copies of the layer so that timing rotates past L2
  const int layers = c.time ? copies_for(o, double(kbytes + vbytes)) : 1;
  std::vector<uint8_t*> dk(layers), dv(layers);
  for (int l = 0; l < layers; ++l) {
    dk[l] = dalloc<uint8_t>(kbytes);
    dv[l] = dalloc<uint8_t>(vbytes);
    CK(cudaMemcpy(dk[l], hk.data(), kbytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dv[l], hv.data(), vbytes, cudaMemcpyHostToDevice));
  }
  std::vector<int32_t> table(pages);
  table.resize((c.max_ctx + B - 1) / B, 0);  // the table covers max_ctx (contract)
  int32_t* dpages = dupload(table);
  const std::vector<int32_t> ctxv = {c.ctx};
  int32_t* dctx = dupload(ctxv);
  float* dq = dupload(q);
  float* dout = dalloc<float>(q.size());
  float* dws = dalloc<float>(kc::attn_workspace_floats(c.n_heads, c.max_ctx, c.D));
  auto kv_of = [&](int l) {
    kc::PagedKv kv;
    kv.k = dk[l], kv.v = dv[l], kv.pages = dpages, kv.format = c.fmt, kv.block = B;
    kv.n_kv = c.n_kv, kv.D = c.D;
    return kv;
  };

  // the default path and, explicitly, the kernel it runs: tensor cores (4-bit formats) or SIMT (f16, f32)
  using Fn = cudaError_t (*)(const kc::PagedKv&, const float*, int, const int32_t*, int, float, float*,
                             float*, cudaStream_t);
  struct Variant {
    std::string name;
    Fn fn;
    double bound;
  };
  if (c.profile) {  // one launch of the default kernels (ncu)
    CK(kc::attention_decode(kv_of(0), dq, c.n_heads, dctx, c.max_ctx, scale, dws, dout, 0));
    CK(cudaDeviceSynchronize());
    std::printf("PROFILE attn_%s ctx=%d: one launch\n", fname, c.ctx);
  }
  // attn_<fmt>: the default (attention_decode); _simt / _mma: each kernel explicitly
  // (the launchers' trailing fresh_k / fresh_v default to none: wrapped to one signature)
  const Fn dflt = [](const kc::PagedKv& kv, const float* q, int nh, const int32_t* cx, int mc, float sc, float* ws,
                     float* out, cudaStream_t st) { return kc::attention_decode(kv, q, nh, cx, mc, sc, ws, out, st); };
  const Fn mma = [](const kc::PagedKv& kv, const float* q, int nh, const int32_t* cx, int mc, float sc, float* ws,
                    float* out, cudaStream_t st) {
    return kc::detail::attention_decode_mma(kv, q, nh, cx, mc, sc, ws, out, st);
  };
  const bool simt = c.fmt == kc::KvFormat::F16 || c.fmt == kc::KvFormat::F32;  // the SIMT kernel's formats
  std::vector<Variant> vars = {{std::string("attn_") + fname, dflt, simt ? 1e-4 : 1e-3}};
  if (!simt) vars.push_back({std::string("attn_") + fname + "_mma", mma, 1e-3});
  if (simt) vars.push_back({std::string("attn_") + fname + "_simt", kc::detail::attention_decode_simt, 1e-4});
  for (const Variant& var : vars) {
    if (c.profile) break;
    CK(cudaMemset(dout, 0xFF, q.size() * 4));  // poison
    CK(var.fn(kv_of(0), dq, c.n_heads, dctx, c.max_ctx, scale, dws, dout, 0));
    CK(cudaDeviceSynchronize());
    const auto out = ddownload(dout, q.size());
    const ErrStats e = compare(out.data(), ref.data(), out.size());
    char sh[96];
    std::snprintf(sh, sizeof sh, "ctx=%d/%d h=%d/%d D=%d%s", c.ctx, c.max_ctx, c.n_heads, c.n_kv, c.D,
                  c.amp != 1.0f ? " small" : "");
    add_validation(var.name + " vs f64", sh, e.max_abs, e.rel_max, e.rel_norm, var.bound);
  }
  // timing: the variants interleaved, three rounds with --attn-decode (one row per variant and round)
  const int rounds = o.attn_decode ? 3 : 1;
  for (int round = 0; c.time && !c.profile && round < rounds; ++round)
    for (const Variant& var : vars) {
      const double bytes = double(c.ctx) * c.n_kv * (rk + rv) + 2.0 * q.size() * 4 + n_pages * 4.0;
      const double us = time_us(o, layers, [&](int l, cudaStream_t st) {
        var.fn(kv_of(l), dq, c.n_heads, dctx, c.max_ctx, scale, dws, dout, st);
      });
      char tsh[64];
      if (rounds > 1) std::snprintf(tsh, sizeof tsh, "ctx=%d r%d", c.ctx, round);
      else std::snprintf(tsh, sizeof tsh, "ctx=%d", c.ctx);  // run_bench.py's key
      add_timing(o, var.name, tsh, us, bytes);
    }
  if (c.time && !c.profile) {  // the split combine alone (its partials as the last variant left them)
    const int split = kc::attn_split_tokens(c.max_ctx), n_splits = kc::attn_splits(c.max_ctx);
    const double us = time_us(o, layers, [&](int, cudaStream_t st) {
      kc::detail::launch_attn_combine(dws, dctx, split, n_splits, c.D, c.n_heads, dout, st);
    });
    char tsh[64];
    std::snprintf(tsh, sizeof tsh, "ctx=%d", c.ctx);
    add_timing(o, std::string("attn_combine_") + fname, tsh, us, double(c.n_heads) * n_splits * (c.D + 2) * 4);
  }
  for (int l = 0; l < layers; ++l) {
    CK(cudaFree(dk[l]));
    CK(cudaFree(dv[l]));
  }
  CK(cudaFree(dpages));
  CK(cudaFree(dctx));
  CK(cudaFree(dq));
  CK(cudaFree(dout));
  CK(cudaFree(dws));
}

// ---- prefill: M new queries at p0.. over p0 cached tokens + their own (causal) --------------------

struct PrefillCase {
  int n_heads, n_kv, D, M, p0;
  kc::KvFormat fmt;
  bool fresh;     // the chunk's own rows read unrounded from f32 (attention_fresh)
  bool validate;  // float64 reference (CPU time grows with M * ctx)
  bool time;
};

void run_prefill(Options& o, const PrefillCase& c) {
  const int B = 16, ctx = c.p0 + c.M, n_pages = (ctx + B - 1) / B, G = c.n_heads / c.n_kv, KD = c.n_kv * c.D;
  const size_t rk = kv_bytes(c.fmt, c.D, false), rv = kv_bytes(c.fmt, c.D, true);
  const size_t kbytes = size_t(n_pages) * B * c.n_kv * rk, vbytes = size_t(n_pages) * B * c.n_kv * rv;
  const auto dt = kvdeck::KvDType(int(c.fmt));
  const char* fname = fmt_name(c.fmt);
  Rng rng(77 + c.M * 5 + c.p0 + int(c.fmt) + c.D + c.fresh);
  std::vector<int32_t> pages(n_pages);
  for (int i = 0; i < n_pages; ++i) pages[i] = i;
  for (int i = n_pages - 1; i > 0; --i) std::swap(pages[i], pages[rng.next() % uint64_t(i + 1)]);
  std::vector<float> kf(size_t(ctx) * KD), vf(kf.size()), q(size_t(c.M) * c.n_heads * c.D);
  for (auto& x : kf) x = rng.normal();
  for (auto& x : vf) x = rng.normal();
  for (auto& x : q) x = rng.normal();
  std::vector<uint8_t> hk(kbytes, 0), hv(vbytes, 0);
  for (int t = 0; t < ctx; ++t)
    for (int g = 0; g < c.n_kv; ++g) {
      const size_t slot = (size_t(pages[t / B]) * B + t % B) * c.n_kv + g;
      kvdeck::cpu::kv_encode_row(dt, false, &kf[size_t(t) * KD + size_t(g) * c.D], c.D, &hk[slot * rk]);
      kvdeck::cpu::kv_encode_row(dt, true, &vf[size_t(t) * KD + size_t(g) * c.D], c.D, &hv[slot * rv]);
    }
  const float scale = 1.0f / std::sqrt(float(c.D));
  std::vector<double> ref(q.size(), 0.0);
  if (c.validate) {  // rows as the pool decodes them (fresh: the own rows unrounded)
    std::vector<float> kd(kf.size()), vd(vf.size());
    for (int t = 0; t < ctx; ++t)
      for (int g = 0; g < c.n_kv; ++g) {
        const size_t slot = (size_t(pages[t / B]) * B + t % B) * c.n_kv + g, i = size_t(t) * KD + size_t(g) * c.D;
        if (c.fresh && t >= c.p0) {
          std::copy(&kf[i], &kf[i] + c.D, &kd[i]);
          std::copy(&vf[i], &vf[i] + c.D, &vd[i]);
        } else {
          kvdeck::cpu::kv_decode_row(dt, false, &hk[slot * rk], c.D, &kd[i]);
          kvdeck::cpu::kv_decode_row(dt, true, &hv[slot * rv], c.D, &vd[i]);
        }
      }
    std::vector<double> sc(ctx);
    for (int m = 0; m < c.M; ++m)
      for (int h = 0; h < c.n_heads; ++h) {
        const int g = h / G, n = c.p0 + m + 1;
        const float* qr = &q[(size_t(m) * c.n_heads + h) * c.D];
        double mx = -1e300, sum = 0;
        for (int t = 0; t < n; ++t) {
          double a = 0;
          const float* kr = &kd[size_t(t) * KD + size_t(g) * c.D];
          for (int i = 0; i < c.D; ++i) a += double(qr[i]) * kr[i];
          sc[t] = a * scale, mx = std::max(mx, sc[t]);
        }
        for (int t = 0; t < n; ++t) sum += (sc[t] = std::exp(sc[t] - mx));
        double* o_ = &ref[(size_t(m) * c.n_heads + h) * c.D];
        for (int t = 0; t < n; ++t) {
          const float* vr = &vd[size_t(t) * KD + size_t(g) * c.D];
          for (int i = 0; i < c.D; ++i) o_[i] += sc[t] / sum * vr[i];
        }
      }
  }
  const int layers = c.time ? copies_for(o, double(kbytes + vbytes)) : 1;
  std::vector<uint8_t*> dk(layers), dv(layers);
  for (int l = 0; l < layers; ++l) {
    dk[l] = dalloc<uint8_t>(kbytes), dv[l] = dalloc<uint8_t>(vbytes);
    CK(cudaMemcpy(dk[l], hk.data(), kbytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dv[l], hv.data(), vbytes, cudaMemcpyHostToDevice));
  }
  std::vector<int32_t> posv(c.M);
  for (int m = 0; m < c.M; ++m) posv[m] = c.p0 + m;
  std::vector<float> fkh(size_t(c.M) * KD), fvh(fkh.size());
  std::copy(kf.begin() + size_t(c.p0) * KD, kf.end(), fkh.begin());
  std::copy(vf.begin() + size_t(c.p0) * KD, vf.end(), fvh.begin());
  int32_t *dpages = dupload(pages), *dpos = dupload(posv);
  float *dq = dupload(q), *dout = dalloc<float>(q.size());
  float *dfk = dupload(fkh), *dfv = dupload(fvh);
  const float* fk = c.fresh ? dfk : nullptr;
  const float* fv = c.fresh ? dfv : nullptr;
  const int ldq = c.n_heads * c.D;
  struct Var {
    std::string name;
    std::function<cudaError_t(int, cudaStream_t)> fn;
    double bound;
  };
  auto kv_of = [&](int l) {
    kc::PagedKv kv;
    kv.k = dk[l], kv.v = dv[l], kv.pages = dpages, kv.format = c.fmt, kv.block = B, kv.n_kv = c.n_kv, kv.D = c.D;
    return kv;
  };
  const std::string base = std::string("attn_prefill_") + fname + (c.fresh ? "_fresh" : "");
  std::vector<Var> vars = {
      {base + "_paged", [&](int l, cudaStream_t st) {
         return kc::attention_paged(int(c.fmt), dk[l], dv[l], dpages, B, c.n_kv, c.D, dq, ldq, c.M, c.n_heads, dpos,
                                    scale, dout, st, 0, nullptr, fk, fv, KD);
       }, 1e-5},
      {base + "_mma", [&](int l, cudaStream_t st) {
         return kc::attention_prefill(kv_of(l), dq, ldq, c.M, c.n_heads, dpos, scale, dout, st, fk, fv, KD, true);
       }, 3e-3},
      {base + "_mma16", [&](int l, cudaStream_t st) {
         return kc::attention_prefill(kv_of(l), dq, ldq, c.M, c.n_heads, dpos, scale, dout, st, fk, fv, KD, false);
       }, 5e-3}};
  char sh[96];
  std::snprintf(sh, sizeof sh, "M=%d p0=%d h=%d/%d D=%d", c.M, c.p0, c.n_heads, c.n_kv, c.D);
  for (const Var& var : vars) {
    if (c.validate) {
      CK(cudaMemset(dout, 0xFF, q.size() * 4));  // poison
      CK(var.fn(0, 0));
      CK(cudaDeviceSynchronize());
      const auto out = ddownload(dout, q.size());
      const ErrStats e = compare(out.data(), ref.data(), out.size());
      add_validation(var.name + " vs f64", sh, e.max_abs, e.rel_max, e.rel_norm, var.bound);
    }
    // the paged kernel takes ~40 ms at p0 4096 (session 6): timed at p0 0 only
    if (c.time && (c.p0 == 0 || var.name != base + "_paged")) {
      const double bytes = double(kbytes + vbytes) + 2.0 * q.size() * 4;
      const double us = time_us(o, layers, [&](int l, cudaStream_t st) { var.fn(l, st); });
      add_timing(o, var.name, sh, us, bytes);
    }
  }
  for (int l = 0; l < layers; ++l) {
    CK(cudaFree(dk[l]));
    CK(cudaFree(dv[l]));
  }
  for (void* p : {static_cast<void*>(dpages), static_cast<void*>(dpos), static_cast<void*>(dq),
                  static_cast<void*>(dout), static_cast<void*>(dfk), static_cast<void*>(dfv)})
    CK(cudaFree(p));
}

}  // namespace

void bench_prefill_attention(Options& o) {
  for (kc::KvFormat f : {kc::KvFormat::F32, kc::KvFormat::F16, kc::KvFormat::NVFP4, kc::KvFormat::NVFP4R, kc::KvFormat::K8V4}) {
    // tails in M and in the 64-row / 64-token tiles, a cached prefix, fresh rows, SmolLM2's 9/3 at D 64
    run_prefill(o, {32, 8, 128, 70, 0, f, false, true, false});
    run_prefill(o, {32, 8, 128, 130, 300, f, true, true, false});
    run_prefill(o, {32, 8, 128, 9, 1000, f, false, true, false});
    run_prefill(o, {9, 3, 64, 45, 17, f, false, true, false});
    run_prefill(o, {9, 3, 64, 100, 200, f, true, true, false});
    if (o.quick) continue;
    // the 8B 512-token prefill (fresh rows where the engine reads them: the 4-bit formats)
    const bool fr = f == kc::KvFormat::NVFP4 || f == kc::KvFormat::NVFP4R || f == kc::KvFormat::K8V4;
    run_prefill(o, {32, 8, 128, 512, 0, f, fr, f == kc::KvFormat::F16, true});
    run_prefill(o, {32, 8, 128, 512, 4096, f, fr, false, true});
  }
}

void profile_attention(Options& o) {
  for (int ctx : {4096, 32768})
    for (kc::KvFormat f : {kc::KvFormat::F16, kc::KvFormat::NVFP4}) {
      AttnCase c{32, 8, 128, ctx, ctx, f, false};
      c.profile = true;
      run_case(o, c);
    }
}

void bench_attention(Options& o) {
  if (!o.attn_decode) bench_prefill_attention(o);
  for (kc::KvFormat f : {kc::KvFormat::F32, kc::KvFormat::F16, kc::KvFormat::NVFP4, kc::KvFormat::NVFP4R, kc::KvFormat::K8V4}) {
    if (o.attn_decode && f == kc::KvFormat::F32) continue;
    // short and ragged contexts, a grid sized for more than ctx, SmolLM2's 9/3 heads at D=64
    run_case(o, {32, 8, 128, 1, 1, f, false});
    run_case(o, {32, 8, 128, 17, 17, f, false});
    run_case(o, {32, 8, 128, 300, 4096, f, false});
    run_case(o, {32, 8, 128, 5000, 40000, f, false});
    run_case(o, {9, 3, 64, 1000, 1000, f, false});
    run_case(o, {32, 8, 128, 9000, 9000, f, false});
    {  // small rows: values x 2^-7 below 2^-14 reach the MMAs as f16 subnormals (attention_mma_rows.cuh)
      AttnCase sc{32, 8, 128, 700, 700, f, false};
      sc.amp = 1.0f / 128;
      run_case(o, sc);
    }
    if (o.quick) continue;
    for (int ctx : {4096, 16384, 32768}) run_case(o, {32, 8, 128, ctx, ctx, f, true});
  }
  if (!o.attn_decode) bench_attention_kpc4(o);
}

}  // namespace bench
