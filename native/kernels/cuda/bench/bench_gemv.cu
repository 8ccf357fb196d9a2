// bench_gemv.cu — GEMV validation (vs the CPU scalar kernels) and timing, Llama-3-8B shapes.
//
// Weights are random codes and scales generated on the device (copies rotate past L2);
// activations are random normal. Validation samples rows of every benchmarked launch and
// recomputes them on the CPU: the activation quantiser must match the CPU's bit for bit, the
// integer GEMVs the CPU's scalar gemm (float order only), the f16 variant a float64 dot of
// the decoded weights and f16-rounded activations.
#include "bench_common.h"
#include "kernels/cpu/kernels_impl.h"
#include "kernels_cuda.h"
#include "kvdeck/formats.h"

namespace bench {

namespace kc = kvdeck::cuda;

namespace {

struct Shape {
  const char* name;
  int K, N;
};

// One weight tensor on the device in both formats, `copies` times.
struct DevWeights {
  int N = 0, K = 0, Kp = 0, copies = 1;
  size_t code_bytes = 0, nv_scale_bytes = 0, w4_scale_count = 0;
  std::vector<uint8_t*> codes, nv_scales;
  std::vector<uint16_t*> w4_scales;
  float tscale = 0.01f;
  int group = 32;
};

DevWeights make_weights(int N, int K, int copies, uint64_t seed) {
  DevWeights w;
  w.N = N, w.K = K, w.Kp = kvdeck::round_up(K, 32), w.copies = copies;
  w.code_bytes = size_t(N) * w.Kp / 2;
  w.nv_scale_bytes = size_t(N) * w.Kp / 16;
  w.w4_scale_count = size_t(N) * w.Kp / w.group;
  for (int c = 0; c < copies; ++c) {
    w.codes.push_back(dalloc<uint8_t>(w.code_bytes));
    w.nv_scales.push_back(dalloc<uint8_t>(w.nv_scale_bytes));
    w.w4_scales.push_back(dalloc<uint16_t>(w.w4_scale_count));
    if (c == 0) {
      dfill_random(w.codes[0], w.code_bytes, seed);
      dfill_random(w.nv_scales[0], w.nv_scale_bytes, seed + 1, 0x28, 24);  // E4M3 0.125 .. 1.75
      dfill_random_f16(w.w4_scales[0], w.w4_scale_count, seed + 2, -0.02f, 0.02f);
    } else {
      CK(cudaMemcpy(w.codes[c], w.codes[0], w.code_bytes, cudaMemcpyDeviceToDevice));
      CK(cudaMemcpy(w.nv_scales[c], w.nv_scales[0], w.nv_scale_bytes, cudaMemcpyDeviceToDevice));
      CK(cudaMemcpy(w.w4_scales[c], w.w4_scales[0], w.w4_scale_count * 2, cudaMemcpyDeviceToDevice));
    }
  }
  return w;
}

void free_weights(DevWeights& w) {
  for (int c = 0; c < w.copies; ++c) {
    CK(cudaFree(w.codes[c]));
    CK(cudaFree(w.nv_scales[c]));
    CK(cudaFree(w.w4_scales[c]));
  }
}

// Rows sampled for validation: up to 48 spread over N, always the first and the last.
std::vector<int> sample_rows(int N) {
  std::vector<int> r;
  const int S = std::min(N, 48);
  for (int i = 0; i < S; ++i) r.push_back(int(int64_t(i) * (N - 1) / std::max(S - 1, 1)));
  r.erase(std::unique(r.begin(), r.end()), r.end());
  return r;
}

// Host copies of the sampled rows of copy 0 (codes, nvfp4 scales, w4a8 scales).
struct HostRows {
  std::vector<int> rows;
  std::vector<uint8_t> codes, nv;
  std::vector<uint16_t> w4;
};

HostRows fetch_rows(const DevWeights& w) {
  HostRows h;
  h.rows = sample_rows(w.N);
  const size_t cb = w.Kp / 2, sb = w.Kp / 16, gb = w.Kp / w.group;
  h.codes.resize(h.rows.size() * cb), h.nv.resize(h.rows.size() * sb), h.w4.resize(h.rows.size() * gb);
  for (size_t i = 0; i < h.rows.size(); ++i) {
    const size_t n = h.rows[i];
    CK(cudaMemcpy(&h.codes[i * cb], w.codes[0] + n * cb, cb, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&h.nv[i * sb], w.nv_scales[0] + n * sb, sb, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&h.w4[i * gb], w.w4_scales[0] + n * gb, gb * 2, cudaMemcpyDeviceToHost));
  }
  return h;
}

std::string shape_str(const DevWeights& w, int M) {
  return std::to_string(w.K) + "x" + std::to_string(w.N) + " M=" + std::to_string(M);
}

// =====================================================================================
// One shape: validate every format at each M, then time
// =====================================================================================

void run_shape(Options& o, const Shape& s, const std::vector<int>& Ms, bool time) {
  const int Kp = kvdeck::round_up(s.K, 32), Mmax = 8;
  const double wbytes = double(s.N) * Kp / 2 + double(s.N) * Kp / 16;  // codes + e4m3 (w4a8: same)
  DevWeights w = make_weights(s.N, s.K, time ? copies_for(o, wbytes) : 1, 0x1234 + s.N + s.K);
  HostRows hr = fetch_rows(w);
  const int S = int(hr.rows.size());

  Rng rng(77 + s.K);
  std::vector<float> x(size_t(Mmax) * s.K);
  for (auto& v : x) v = rng.normal();
  float* dx = dupload(x);
  int8_t* dq = dalloc<int8_t>(size_t(Mmax) * Kp);
  float* dd = dalloc<float>(size_t(Mmax) * Kp / 32);
  int32_t* ds = dalloc<int32_t>(size_t(Mmax) * Kp / 32);
  uint16_t* dh = dalloc<uint16_t>(size_t(Mmax) * Kp);
  float* dy = dalloc<float>(size_t(Mmax) * s.N);

  const auto& cpu = kvdeck::cpu::scalar_kernels();
  std::vector<int8_t> cq(size_t(Mmax) * Kp);
  std::vector<float> cd(size_t(Mmax) * Kp / 32);
  std::vector<int32_t> cs(size_t(Mmax) * Kp / 32);
  std::vector<float> wdq(size_t(S) * s.K);  // decoded nvfp4 rows
  kvdeck::nvfp4_dequantize(hr.codes.data(), hr.nv.data(), w.tscale, S, s.K, wdq.data());

  for (int M : Ms) {
    const std::string sh = shape_str(w, M);
    // activation quantiser: bit-identical to the CPU
    kvdeck::ActQ8 a{M, Kp, cq.data(), cd.data(), cs.data()};
    cpu.quantize_act_q8(x.data(), M, s.K, a);
    CK(kc::quantize_act_q8(dx, M, s.K, Kp, dq, dd, ds, 0));
    const auto gq = ddownload(dq, size_t(M) * Kp);
    const auto gd = ddownload(dd, size_t(M) * Kp / 32);
    const auto gs = ddownload(ds, size_t(M) * Kp / 32);
    double mism = 0;
    for (size_t i = 0; i < gq.size(); ++i) mism += gq[i] != cq[i];
    for (size_t i = 0; i < gd.size(); ++i) mism += (gd[i] != cd[i]) + (gs[i] != cs[i]);
    add_validation("act_q8 (mismatches)", sh, mism, mism, mism, 0.0);

    // the three GEMVs on copy 0, then the sampled rows against the CPU
    kvdeck::WeightView wv;
    wv.N = S, wv.K = s.K, wv.Kp = Kp;
    std::vector<float> ref(size_t(M) * S);
    std::vector<double> refd(size_t(M) * S);
    std::vector<float> got(size_t(M) * S);
    auto check = [&](const char* name, double bound) {
      const auto y = ddownload(dy, size_t(M) * s.N);
      for (int m = 0; m < M; ++m)
        for (int i = 0; i < S; ++i) got[size_t(m) * S + i] = y[size_t(m) * s.N + hr.rows[i]];
      const ErrStats e = compare(got.data(), refd.data(), got.size());
      add_validation(name, sh, e.max_abs, e.rel_max, e.rel_norm, bound);
    };
    auto cpu_gemm = [&]() {
      cpu.gemm(wv, x.data(), &a, M, ref.data(), S, 0, S);
      for (size_t i = 0; i < ref.size(); ++i) refd[i] = ref[i];
    };

    wv.dtype = kvdeck::DType::NVFP4, wv.group = 16, wv.data = hr.codes.data(), wv.scales = hr.nv.data();
    wv.tscale = w.tscale;
    CK(cudaMemset(dy, 0xFF, size_t(M) * s.N * 4));  // poison: NaN where not written
    CK(kc::gemv_nvfp4_dp4a(w.codes[0], w.nv_scales[0], w.tscale, s.N, Kp, dq, dd, M, dy, s.N, 0));
    cpu_gemm();
    check("nvfp4_dp4a vs cpu", 1e-5);
    if (M == 1) {  // the alternative decode (two magnitude lookups), same result
      CK(cudaMemset(dy, 0xFF, size_t(M) * s.N * 4));
      CK(kc::detail::gemv_m1_config(2, 1, 2, true, w.codes[0], w.nv_scales[0], w.tscale, 16, s.N, Kp, dq, dd,
                                    ds, dy, 0));
      check("nvfp4_posneg vs cpu", 1e-5);
      CK(cudaMemset(dy, 0xFF, size_t(M) * s.N * 4));
      CK(kc::gemv_nvfp4_q8fused(w.codes[0], w.nv_scales[0], w.tscale, s.N, s.K, Kp, dx, dy, 0, true));
      check("nvfp4 q8fused vs cpu", 1e-5);
    }
    // the same result against float64 with unquantised activations (quantisation effect)
    for (int m = 0; m < M; ++m)
      for (int i = 0; i < S; ++i) {
        double acc = 0;
        for (int k = 0; k < s.K; ++k) acc += double(wdq[size_t(i) * s.K + k]) * x[size_t(m) * s.K + k];
        refd[size_t(m) * S + i] = acc;
      }
    check("nvfp4_dp4a vs f64 x", 3e-2);

    CK(kc::convert_act_f16(dx, M, s.K, Kp, dh, 0));
    CK(cudaMemset(dy, 0xFF, size_t(M) * s.N * 4));
    CK(kc::gemv_nvfp4_f16(w.codes[0], w.nv_scales[0], w.tscale, s.N, Kp, dh, M, dy, s.N, 0));
    for (int m = 0; m < M; ++m)
      for (int i = 0; i < S; ++i) {
        double acc = 0;
        for (int k = 0; k < s.K; ++k)
          acc += double(wdq[size_t(i) * s.K + k]) *
                 kvdeck::f16_to_f32(kvdeck::f32_to_f16(x[size_t(m) * s.K + k]));
        refd[size_t(m) * S + i] = acc;
      }
    check("nvfp4_f16 vs f64 (f16 x)", 5e-3);

    wv.dtype = kvdeck::DType::W4A8, wv.group = w.group, wv.data = hr.codes.data(), wv.scales = hr.w4.data();
    CK(cudaMemset(dy, 0xFF, size_t(M) * s.N * 4));
    CK(kc::gemv_w4a8(w.codes[0], w.w4_scales[0], w.group, s.N, Kp, dq, dd, ds, M, dy, s.N, 0));
    cpu_gemm();
    check("w4a8 vs cpu", 1e-5);
    if (M == 1) {
      CK(cudaMemset(dy, 0xFF, size_t(M) * s.N * 4));
      CK(kc::gemv_w4a8_q8fused(w.codes[0], w.w4_scales[0], w.group, s.N, s.K, Kp, dx, dy, 0, true));
      check("w4a8 q8fused vs cpu", 1e-5);
    }
    // the PDL launch path after a quantiser launched with PDL: same results
    CK(cudaMemset(dy, 0xFF, size_t(M) * s.N * 4));
    CK(cudaMemset(dq, 0, size_t(M) * Kp));
    CK(kc::quantize_act_q8(dx, M, s.K, Kp, dq, dd, ds, 0, true));
    CK(kc::gemv_w4a8(w.codes[0], w.w4_scales[0], w.group, s.N, Kp, dq, dd, ds, M, dy, s.N, 0, true));
    check("w4a8 pdl vs cpu", 1e-5);
    CK(cudaDeviceSynchronize());

    if (!time) continue;
    const double act_q8 = double(M) * Kp * 9 / 8 + double(M) * Kp / 32 * 4;  // q + d (+ s for w4a8)
    const double out = double(M) * s.N * 4, xin = double(M) * s.K * 4;
    const double nv_bytes = wbytes + act_q8 + out;
    const double w4_bytes = double(s.N) * Kp / 2 + double(w.w4_scale_count) * 2 + act_q8 + out;
    const int C = w.copies;
    double us = time_us(o, C, [&](int c, cudaStream_t st) {
      kc::gemv_nvfp4_dp4a(w.codes[c], w.nv_scales[c], w.tscale, s.N, Kp, dq, dd, M, dy, s.N, st);
    });
    add_timing(o, std::string("nvfp4_dp4a ") + s.name, sh, us, nv_bytes);
    us = time_us(o, C, [&](int c, cudaStream_t st) {
      kc::quantize_act_q8(dx, M, s.K, Kp, dq, dd, ds, st);
      kc::gemv_nvfp4_dp4a(w.codes[c], w.nv_scales[c], w.tscale, s.N, Kp, dq, dd, M, dy, s.N, st);
    });
    add_timing(o, std::string("nvfp4_dp4a+q ") + s.name, sh, us, nv_bytes + xin + act_q8);
    us = time_us(o, C, [&](int c, cudaStream_t st) {
      kc::gemv_nvfp4_f16(w.codes[c], w.nv_scales[c], w.tscale, s.N, Kp, dh, M, dy, s.N, st);
    });
    add_timing(o, std::string("nvfp4_f16 ") + s.name, sh, us, wbytes + double(M) * Kp * 2 + out);
    us = time_us(o, C, [&](int c, cudaStream_t st) {
      kc::convert_act_f16(dx, M, s.K, Kp, dh, st);
      kc::gemv_nvfp4_f16(w.codes[c], w.nv_scales[c], w.tscale, s.N, Kp, dh, M, dy, s.N, st);
    });
    add_timing(o, std::string("nvfp4_f16+cvt ") + s.name, sh, us, wbytes + double(M) * Kp * 8 + out);
    us = time_us(o, C, [&](int c, cudaStream_t st) {
      kc::gemv_w4a8(w.codes[c], w.w4_scales[c], w.group, s.N, Kp, dq, dd, ds, M, dy, s.N, st);
    });
    add_timing(o, std::string("w4a8 ") + s.name, sh, us, w4_bytes);
    us = time_us(o, C, [&](int c, cudaStream_t st) {
      kc::quantize_act_q8(dx, M, s.K, Kp, dq, dd, ds, st);
      kc::gemv_w4a8(w.codes[c], w.w4_scales[c], w.group, s.N, Kp, dq, dd, ds, M, dy, s.N, st);
    });
    add_timing(o, std::string("w4a8+q ") + s.name, sh, us, w4_bytes + xin + act_q8);
    // the same with programmatic dependent launch (each kernel overlaps its predecessor's tail)
    us = time_us(o, C, [&](int c, cudaStream_t st) {
      kc::gemv_nvfp4_dp4a(w.codes[c], w.nv_scales[c], w.tscale, s.N, Kp, dq, dd, M, dy, s.N, st, true);
    });
    add_timing(o, std::string("nvfp4_dp4a_pdl ") + s.name, sh, us, nv_bytes);
    us = time_us(o, C, [&](int c, cudaStream_t st) {
      kc::quantize_act_q8(dx, M, s.K, Kp, dq, dd, ds, st, true);
      kc::gemv_nvfp4_dp4a(w.codes[c], w.nv_scales[c], w.tscale, s.N, Kp, dq, dd, M, dy, s.N, st, true);
    });
    add_timing(o, std::string("nvfp4_dp4a+q_pdl ") + s.name, sh, us, nv_bytes + xin + act_q8);
    us = time_us(o, C, [&](int c, cudaStream_t st) {
      kc::gemv_w4a8(w.codes[c], w.w4_scales[c], w.group, s.N, Kp, dq, dd, ds, M, dy, s.N, st, true);
    });
    add_timing(o, std::string("w4a8_pdl ") + s.name, sh, us, w4_bytes);
    us = time_us(o, C, [&](int c, cudaStream_t st) {
      kc::quantize_act_q8(dx, M, s.K, Kp, dq, dd, ds, st, true);
      kc::gemv_w4a8(w.codes[c], w.w4_scales[c], w.group, s.N, Kp, dq, dd, ds, M, dy, s.N, st, true);
    });
    add_timing(o, std::string("w4a8+q_pdl ") + s.name, sh, us, w4_bytes + xin + act_q8);
    if (M != 1) continue;
    // activation quantisation fused into the GEMV (one kernel), without and with PDL
    for (int pdl = 0; pdl < 2; ++pdl) {
      us = time_us(o, C, [&](int c, cudaStream_t st) {
        kc::gemv_nvfp4_q8fused(w.codes[c], w.nv_scales[c], w.tscale, s.N, s.K, Kp, dx, dy, st, pdl);
      });
      add_timing(o, std::string(pdl ? "nvfp4_dp4a+qf_pdl " : "nvfp4_dp4a+qf ") + s.name, sh, us, wbytes + xin + out);
      us = time_us(o, C, [&](int c, cudaStream_t st) {
        kc::gemv_w4a8_q8fused(w.codes[c], w.w4_scales[c], w.group, s.N, s.K, Kp, dx, dy, st, pdl);
      });
      add_timing(o, std::string(pdl ? "w4a8+qf_pdl " : "w4a8+qf ") + s.name, sh, us,
                 double(s.N) * Kp / 2 + double(w.w4_scale_count) * 2 + xin + out);
    }
    // batch-1 configurations: rows per warp R, chunks in flight per lane U
    for (int fmt = 0; fmt < 3; ++fmt)
      for (int cfg : {11, 12, 14, 22, 111, 112, 114, 122}) {
        const int R = cfg / 10 % 10, U = cfg % 10;
        const bool pf = cfg >= 100;
        us = time_us(o, C, [&](int c, cudaStream_t st) {
          kc::detail::gemv_m1_config(fmt, R, U, pf, w.codes[c],
                                     fmt == 1 ? (const void*)w.w4_scales[c] : w.nv_scales[c], w.tscale, w.group,
                                     s.N, Kp, dq, dd, ds, dy, st);
        });
        add_timing(o, std::string(fmt == 1 ? "tune w4a8 R" : fmt ? "tune nvfp4pn R" : "tune nvfp4 R") + std::to_string(R) + "U" +
                          std::to_string(U) + (pf ? "P " : " ") + s.name, sh, us, fmt == 1 ? w4_bytes : nv_bytes);
      }
  }
  CK(cudaFree(dx));
  CK(cudaFree(dq));
  CK(cudaFree(dd));
  CK(cudaFree(ds));
  CK(cudaFree(dh));
  CK(cudaFree(dy));
  free_weights(w);
}

}  // namespace

void bench_gemv(Options& o) {
  // Llama-3-8B decode shapes (K -> N)
  const Shape full[] = {{"qkv", 4096, 6144},       {"o", 4096, 4096},
                        {"gate_up", 4096, 28672},  {"down", 14336, 4096},
                        {"lm_head", 4096, 128256}};
  // validation-only shapes: K not a multiple of 32 (padding), N not a multiple of the rows
  // per block, every M
  if (o.gemv1) {  // --gemv1: batch 1 of the five shapes only (validated, then timed)
    for (const Shape& s : full) run_shape(o, s, {1}, true);
    return;
  }
  const Shape small[] = {{"pad", 1000, 77}, {"wide", 14336, 130}};
  for (const Shape& s : small) run_shape(o, s, {1, 2, 3, 4, 5, 6, 7, 8}, false);
  if (o.quick) {
    run_shape(o, {"qkv", 4096, 6144}, {1, 8}, false);
    return;
  }
  for (const Shape& s : full) run_shape(o, s, {1, 4, 8}, true);
}

}  // namespace bench
