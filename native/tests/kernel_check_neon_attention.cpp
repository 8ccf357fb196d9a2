// kernel_check_neon_attention.cpp — the neon attention kernels against the scalar set (part of
// kernel_check_neon.cpp's check_neon_vs_scalar; bounds stated in that file's header): decode over
// f32 / f16 / nvfp4 pages, f16 / nvfp4 pages == f32 pages of the decoded rows, prefill == decode.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvdeck/engine.h"
#include "kvdeck/formats.h"
#include "kvdeck/kernels.h"
#include "kvdeck/ops_cpu.h"

#include "kernel_check_neon.h"

using namespace kvdeck;

namespace kvdeck::neon_check {
namespace {

// ---- attention ----------------------------------------------------------------------
struct Pool {
  std::vector<float> kf, vf;       // f32 pages (for F16 / NVFP4: the decoded rows)
  std::vector<uint8_t> kb, vb;     // f16 / nvfp4 pages
  std::vector<int32_t> pages;
  cpu::KvView view(KvDType t) const {
    const bool f = t == KvDType::F32;
    return cpu::KvView{f ? static_cast<const void*>(kf.data()) : kb.data(), f ? static_cast<const void*>(vf.data()) : vb.data(),
                       t, block, nkv, D, pages.data()};
  }
  int block, nkv, D;
};

Pool make_pool(KvDType t, int block, int nkv, int D, int ctx) {
  Pool p;
  p.block = block, p.nkv = nkv, p.D = D;
  const int n_pages = (ctx + block - 1) / block;
  const size_t rows = size_t(n_pages) * block * nkv, rb = kv_row_bytes(t, D);
  p.kf.resize(rows * D), p.vf.resize(rows * D), p.kb.resize(rows * rb), p.vb.resize(rows * rb);
  for (int side = 0; side < 2; ++side) {
    std::vector<float>& f = side ? p.vf : p.kf;
    std::vector<uint8_t>& b = side ? p.vb : p.kb;
    for (size_t r = 0; r < rows; ++r) {
      float* x = f.data() + r * D;
      for (int i = 0; i < D; ++i) x[i] = normal() * (1.0f + float(r % 3));
      if (t == KvDType::F16) {
        auto* h = reinterpret_cast<uint16_t*>(b.data() + r * rb);
        cpu::f32_to_f16_row(x, h, D);
        cpu::f16_to_f32_row(h, x, D);
      } else if (t == KvDType::NVFP4) {
        cpu::kv_nvfp4_encode_row(x, D, b.data() + r * rb);
        cpu::kv_nvfp4_decode_row(b.data() + r * rb, D, x);
      }
    }
  }
  for (int i = 0; i < n_pages; ++i) p.pages.push_back((i * 7 + 3) % n_pages);  // scrambled, a permutation
  if (n_pages % 7 == 0)
    for (int i = 0; i < n_pages; ++i) p.pages[i] = n_pages - 1 - i;
  return p;
}

}  // namespace

void check_attention() {
  struct Shape { int D, block, G, ctx; };
  for (const Shape sh : {Shape{64, 16, 3, 600}, Shape{128, 32, 2, 300}, Shape{96, 16, 1, 41}, Shape{32, 64, 4, 257}}) {
    for (KvDType t : {KvDType::F32, KvDType::F16, KvDType::NVFP4}) {
      const int nkv = 2, g = 1, G = sh.G, D = sh.D;
      const Pool p = make_pool(t, sh.block, nkv, D, sh.ctx);
      const cpu::KvView kv = p.view(t), kv32 = p.view(KvDType::F32);
      const float scale = 1.0f / std::sqrt(float(D));
      const int nq = 5, p0 = sh.ctx - nq;
      const size_t ldq = size_t(nkv) * G * D;
      std::vector<float> q(size_t(nq) * ldq);
      for (auto& e : q) e = normal();
      std::vector<float> work(cpu::attention_queries_work_floats(nq, G, sh.ctx, sh.block, D));
      auto decode = [&](const cpu::KvView& v, int i, float* out) {  // query i (ctx p0 + i + 1)
        cpu::attention_query(v, g, q.data() + i * ldq + size_t(g) * G * D, G, p0 + i + 1, scale, out, work.data());
      };
      std::vector<float> os(size_t(nq) * G * D), on(os.size()), o32(os.size()), opre(size_t(nq) * ldq, 0.0f);
      with("scalar", [&] { for (int i = 0; i < nq; ++i) decode(kv, i, os.data() + size_t(i) * G * D); });
      with("neon", [&] {
        for (int i = 0; i < nq; ++i) decode(kv, i, on.data() + size_t(i) * G * D);
        for (int i = 0; i < nq; ++i) decode(kv32, i, o32.data() + size_t(i) * G * D);
        cpu::attention_queries(kv, g, q.data(), ldq, G, 0, nq, p0, scale, opre.data(), ldq, work.data());
      });
      double vmax = 0, worst = 0;
      for (float v : p.vf) vmax = std::max(vmax, double(std::fabs(v)));
      for (size_t i = 0; i < os.size(); ++i) worst = std::max(worst, std::fabs(double(on[i]) - os[i]));
      int pre_bad = 0;
      for (int i = 0; i < nq; ++i)
        for (int e = 0; e < G * D; ++e) pre_bad += bits(opre[i * ldq + size_t(g) * G * D + e]) != bits(on[size_t(i) * G * D + e]);
      const std::string name = std::string("neon attention ") + kv_dtype_name(t) + " D=" + std::to_string(D) +
                               " block=" + std::to_string(sh.block) + " ctx=" + std::to_string(sh.ctx);
      char buf[96];
      std::snprintf(buf, sizeof buf, ": max |neon - scalar| %.3g (bound 4e-6 * max|v| = %.3g)", worst, 4e-6 * vmax);
      g_check(worst <= 4e-6 * vmax, name + buf);
      g_check(bits_differ(on, o32) == 0, name + ": differs from f32 pages of the decoded rows");
      g_check(pre_bad == 0, name + ": prefill tile differs from decode in " + std::to_string(pre_bad) + " values");
      // f32 pages in place (the backend's prefill workspace): the neon rows kernel
      // (attention_prefill_neon.cpp), 37 queries (rows past 16-row blocks, padding lanes; the
      // first shape crosses a segment edge) against decode over the same pages, bit for bit.
      const int nq2 = std::min(37, sh.ctx), p2 = sh.ctx - nq2;
      std::vector<float> q2(size_t(nq2) * ldq), r2(q2.size(), 0.0f), d2(size_t(G) * D);
      for (auto& e : q2) e = normal();
      std::vector<float> work2(cpu::attention_queries_work_floats(nq2, G, sh.ctx, sh.block, D));
      int rows_bad = 0;
      with("neon", [&] {
        cpu::attention_queries(kv32, g, q2.data(), ldq, G, 0, nq2, p2, scale, r2.data(), ldq, work2.data());
        for (int i = 0; i < nq2; ++i) {
          cpu::attention_query(kv32, g, q2.data() + i * ldq + size_t(g) * G * D, G, p2 + i + 1, scale, d2.data(),
                               work2.data());
          for (int e = 0; e < G * D; ++e) rows_bad += bits(r2[i * ldq + size_t(g) * G * D + e]) != bits(d2[e]);
        }
      });
      g_check(rows_bad == 0, name + ": f32 prefill rows differ from decode in " + std::to_string(rows_bad) + " values");
    }
  }
}

}  // namespace kvdeck::neon_check
