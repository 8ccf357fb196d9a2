// bind_kernels.cpp — Python submodule `_native.kernels`: the CPU kernels of kernels.h.
// Binding code only: argument checking, buffer allocation, GIL release around kernel calls.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "kvdeck/kernels.h"
#include "kvdeck/ops_cpu.h"

namespace py = pybind11;
using namespace kvdeck;

namespace {

template <typename T>
using Arr = py::array_t<T, py::array::c_style | py::array::forcecast>;

DType parse_dtype(const std::string& s) {
  if (s == "f32") return DType::F32;
  if (s == "f16") return DType::F16;
  if (s == "nvfp4") return DType::NVFP4;
  if (s == "w4a8") return DType::W4A8;
  if (s == "w8a8") return DType::W8A8;
  throw std::invalid_argument("dtype must be one of f32, f16, nvfp4, w4a8, w8a8; got " + s);
}

void require(bool ok, const std::string& msg) {
  if (!ok) throw std::invalid_argument(msg);
}

// (q int8 [M,Kp], d f32 [M,Kp/32], s int32 [M,Kp/32]) from x f32 [M,K]; bits 16: q int16.
py::tuple py_quantize(const Arr<float>& x, int bits) {
  require(x.ndim() == 2, "x must be 2-D [M, K]");
  require(bits == 8 || bits == 16, "bits must be 8 or 16");
  const int M = int(x.shape(0)), K = int(x.shape(1)), Kp = round_up(K, kQ8Block);
  py::array_t<int8_t> q(bits == 8 ? std::vector<py::ssize_t>{M, Kp} : std::vector<py::ssize_t>{0, 0});
  py::array_t<int16_t> q16(bits == 16 ? std::vector<py::ssize_t>{M, Kp} : std::vector<py::ssize_t>{0, 0});
  py::array_t<float> d({M, Kp / kQ8Block});
  py::array_t<int32_t> s({M, Kp / kQ8Block});
  ActQ8 a{M, Kp, bits == 8 ? q.mutable_data() : nullptr, d.mutable_data(), s.mutable_data(),
          bits == 16 ? q16.mutable_data() : nullptr};
  const float* xp = x.data();
  {
    py::gil_scoped_release nogil;
    quantize_act_q8(xp, M, K, a);
  }
  if (bits == 16) return py::make_tuple(q16, d, s);
  return py::make_tuple(q, d, s);
}

// y f32 [M, ldy] (columns outside [n0, n1) are 0). Weight arrays by dtype:
//   f32: data f32 [N,K] | f16: data u16/f16 [N,K] | nvfp4: data codes u8 [N,Kp/2],
//   scales u8 [N,Kp/16], tscale | w4a8: data codes u8 [N,Kp/2], scales f16 [N,Kp/group].
// x f32 [M, K] (K = the logical K); quantised formats quantise x with quantize_act_q8.
// repeat > 1 calls the kernel that many times without the GIL (benchmarks).
py::array_t<float> py_gemm(const std::string& dtype, py::array data, const Arr<float>& x,
                           std::optional<py::array> scales, float tscale, int n0,
                           std::optional<int> n1_opt, std::optional<int> ldy_opt, int repeat,
                           std::optional<py::array> mins, const std::string& layout, int act_bits) {
  require(act_bits == 8 || act_bits == 16, "act_bits must be 8 or 16");
  WeightView w;
  w.dtype = parse_dtype(dtype);
  require(x.ndim() == 2, "x must be 2-D [M, K]");
  require(data.ndim() == 2, "weight data must be 2-D");
  const int M = int(x.shape(0)), K = int(x.shape(1));
  const int N = int(data.shape(0));
  w.N = N;
  w.K = K;
  Arr<uint8_t> codes, sc_u8;
  Arr<uint16_t> sc_u16, w16, mn_u16;
  Arr<int8_t> codes8;
  auto as_u16 = [](const py::array& a) {
    return py::array_t<uint16_t, py::array::c_style>::ensure(
        py::array(py::dtype("uint16"), a.request().shape, a.request().strides, a.data(), a));
  };
  Arr<float> w32;
  switch (w.dtype) {
    case DType::F32:
      w32 = Arr<float>::ensure(data);
      require(int(w32.shape(1)) == K, "f32 weight must be [N, K]");
      w.Kp = K, w.data = w32.data();
      break;
    case DType::F16:
      require(data.itemsize() == 2, "f16 weight must be float16 or uint16 [N, K]");
      w16 = py::array_t<uint16_t, py::array::c_style>::ensure(
          py::array(py::dtype("uint16"), data.request().shape, data.request().strides, data.data(), data));
      require(int(w16.shape(1)) == K, "f16 weight must be [N, K]");
      w.Kp = K, w.data = w16.data();
      break;
    case DType::NVFP4:
    case DType::W4A8: {
      codes = Arr<uint8_t>::ensure(data);
      w.Kp = int(codes.shape(1)) * 2;
      require(w.Kp == round_up(K, kQuantPad), "codes must be [N, round_up(K,32)/2]");
      require(scales.has_value(), "scales are required for quantised formats");
      w.data = codes.data();
      if (w.dtype == DType::NVFP4) {
        sc_u8 = Arr<uint8_t>::ensure(*scales);
        require(sc_u8.ndim() == 2 && sc_u8.shape(0) == N && sc_u8.shape(1) == w.Kp / kNvfp4Block,
                "nvfp4 scales must be u8 [N, Kp/16]");
        w.scales = sc_u8.data();
        w.group = kNvfp4Block;
        w.tscale = tscale;
      } else {
        require(scales->itemsize() == 2 && scales->ndim() == 2 && scales->shape(0) == N,
                "w4a8 scales must be f16 [N, Kp/group]");
        sc_u16 = py::array_t<uint16_t, py::array::c_style>::ensure(py::array(
            py::dtype("uint16"), scales->request().shape, scales->request().strides, scales->data(), *scales));
        const int ng = int(sc_u16.shape(1));
        require(ng > 0 && w.Kp % ng == 0 && (w.Kp / ng) % 2 == 0, "w4a8 group must be even and divide Kp");
        w.group = w.Kp / ng;
        w.scales = sc_u16.data();
        if (mins.has_value()) {
          require(w.group == kQ8Block, "w4a8 mins need group 32");
          require(mins->itemsize() == 2 && mins->ndim() == 2 && mins->shape(0) == N && mins->shape(1) == ng,
                  "w4a8 mins must be f16 [N, Kp/32]");
          mn_u16 = as_u16(*mins);
          w.mins = mn_u16.data();
        }
      }
      break;
    }
    case DType::W8A8: {
      require(data.itemsize() == 1, "w8a8 codes must be int8 [N, Kp]");
      codes8 = Arr<int8_t>::ensure(py::array(py::dtype("int8"), data.request().shape, data.request().strides,
                                             data.data(), data));
      w.Kp = int(codes8.shape(1));
      require(w.Kp == round_up(K, kQuantPad), "w8a8 codes must be [N, round_up(K,32)]");
      require(scales.has_value() && scales->itemsize() == 2 && scales->ndim() == 2 && scales->shape(0) == N &&
                  scales->shape(1) == w.Kp / kQ8Block,
              "w8a8 scales must be f16 [N, Kp/32]");
      sc_u16 = as_u16(*scales);
      w.data = codes8.data();
      w.scales = sc_u16.data();
      w.group = kQ8Block;
      break;
    }
  }
  // layout "nvfp4_x4": data and scales are already in the Nvfp4X4 layout (repack_nvfp4_x4);
  // "q4_1_x8": w4a8 + mins codes in the Q41X8 layout (repack_q4_1_x8).
  require(layout == "file" || (layout == "nvfp4_x4" && w.dtype == DType::NVFP4) ||
              (layout == "q4_1_x8" && w.dtype == DType::W4A8 && w.mins && w.group == kQ8Block),
          "layout must be 'file', 'nvfp4_x4' for nvfp4 weights or 'q4_1_x8' for w4a8 with mins; got " + layout);
  if (layout == "nvfp4_x4") w.layout = WeightLayout::Nvfp4X4;
  if (layout == "q4_1_x8") w.layout = WeightLayout::Q41X8;
  const int n1 = n1_opt.value_or(N), ldy = ldy_opt.value_or(N);
  require(0 <= n0 && n0 <= n1 && n1 <= N, "need 0 <= n0 <= n1 <= N");
  require(ldy >= n1, "ldy must be >= n1");
  py::array_t<float> y({M, ldy});
  std::memset(y.mutable_data(), 0, sizeof(float) * size_t(M) * ldy);
  float* yp = y.mutable_data();
  const float* xp = x.data();
  const bool quantised = is_integer(w.dtype);
  {
    py::gil_scoped_release nogil;
    std::vector<int8_t> q;
    std::vector<float> d;
    std::vector<int32_t> s;
    std::vector<int16_t> q16;
    ActQ8 a;
    if (quantised) {
      const int Kp = w.Kp;
      q.resize(size_t(M) * Kp), d.resize(size_t(M) * Kp / kQ8Block), s.resize(d.size());
      a = ActQ8{M, Kp, q.data(), d.data(), s.data()};
      if (act_bits == 16) q16.resize(size_t(M) * Kp), a.q16 = q16.data();
      quantize_act_q8(xp, M, K, a);
    }
    for (int r = 0; r < std::max(1, repeat); ++r)
      gemm(w, xp, quantised ? &a : nullptr, M, yp, ldy, n0, n1);
  }
  return y;
}

// out f32 [G, D]: attention of one query (G heads of KV head g) over ctx tokens of pages
// k, v (f32 or f16 [n_pages, block, nkv, D], pages i32 [ceil(ctx/block)]); ref: the portable
// kernel instead of the dispatched one; split: segments computed apart and combined (decode).
py::array_t<float> py_attention(const py::array& q, const py::array& k, const py::array& v,
                                const Arr<int32_t>& pages, int g, int ctx, bool ref) {
  require(q.ndim() == 2 && k.ndim() == 4 && v.ndim() == 4, "q [G, D], k/v [n_pages, block, nkv, D]");
  const bool f16 = k.dtype().is(py::dtype("float16"));
  require(f16 || k.dtype().is(py::dtype::of<float>()), "k, v must be f32 or f16");
  require(k.dtype().is(v.dtype()) && k.request().shape == v.request().shape, "k and v must match");
  auto qf = Arr<float>::ensure(q);
  const int G = int(qf.shape(0)), D = int(qf.shape(1)), block = int(k.shape(1)), nkv = int(k.shape(2));
  require(int(k.shape(3)) == D && 0 <= g && g < nkv && ctx >= 1 &&
              int(pages.size()) >= (ctx + block - 1) / block,
          "shapes: D, g < nkv, pages cover ctx");
  auto kc = py::array::ensure(k, py::array::c_style), vc = py::array::ensure(v, py::array::c_style);
  for (int i = 0; i < int(pages.size()); ++i)
    require(0 <= pages.data()[i] && pages.data()[i] < k.shape(0), "page index out of range");
  cpu::KvView kv{kc.data(), vc.data(), f16 ? KvDType::F16 : KvDType::F32, block, nkv, D, pages.data()};
  py::array_t<float> out({G, D});
  {
    py::gil_scoped_release nogil;
    const float scale = 1.0f / std::sqrt(float(D));
    std::vector<float> work(cpu::attention_work_floats(G, ctx, block, D));
    if (!ref) {
      cpu::attention_query(kv, g, qf.data(), G, ctx, scale, out.mutable_data(), work.data());
    } else {
      const int seg = cpu::attn_segment(block), S = (ctx + seg - 1) / seg;
      float *o = work.data(), *mm = o + size_t(S) * G * D, *l = mm + size_t(S) * G, *tile = l + size_t(S) * G;
      for (int s = 0; s < S; ++s)
        cpu::attention_segment_ref(kv, g, qf.data(), G, s * seg, std::min(ctx, (s + 1) * seg), scale,
                                   o + size_t(s) * G * D, mm + s * G, l + s * G, tile);
      cpu::attention_combine(o, mm, l, S, G, D, out.mutable_data());
    }
  }
  return out;
}

}  // namespace

void bind_kernels(py::module_& m) {
  py::module_ k = m.def_submodule("kernels", "CPU compute kernels (kvdeck/kernels.h)");
  k.def("quantize_act_q8", &py_quantize, py::arg("x"), py::kw_only(), py::arg("bits") = 8,
        "x f32 [M,K] -> (q int8 [M,Kp], d f32 [M,Kp/32], s int32 [M,Kp/32]); bits=16: q int16\n"
        "(16-bit activations, d = amax / 32767).");
  k.def("gemm", &py_gemm, py::arg("dtype"), py::arg("data"), py::arg("x"), py::kw_only(),
        py::arg("scales") = py::none(), py::arg("tscale") = 1.0f, py::arg("n0") = 0,
        py::arg("n1") = py::none(), py::arg("ldy") = py::none(), py::arg("repeat") = 1,
        py::arg("mins") = py::none(), py::arg("layout") = "file", py::arg("act_bits") = 8,
        "y[m, n] = sum_k x[m,k] W[n,k] for n in [n0, n1): f32 [M, ldy], other columns 0.\n"
        "dtype f32|f16|nvfp4|w4a8|w8a8 (w4a8 with mins f16 [N, Kp/32]: GGUF Q4_1); quantised\n"
        "formats quantise x with quantize_act_q8. layout='nvfp4_x4': nvfp4 data/scales from\n"
        "repack_nvfp4_x4 (what the CPU backend does at load, in place). act_bits=16: 16-bit\n"
        "activations (w4a8 with group a multiple of 32, w8a8; other formats raise ValueError).");
  k.def("repack_nvfp4_x4", [](const Arr<uint8_t>& codes, const Arr<uint8_t>& scales) {
          require(codes.ndim() == 2 && scales.ndim() == 2 && codes.shape(0) == scales.shape(0) &&
                      codes.shape(1) * 2 % kQuantPad == 0 && scales.shape(1) * kNvfp4Block == codes.shape(1) * 2,
                  "nvfp4 codes u8 [N, Kp/2] and scales u8 [N, Kp/16] with Kp a multiple of 32");
          const int N = int(codes.shape(0)), Kp = int(codes.shape(1)) * 2;
          py::array_t<uint8_t> c({N, Kp / 2}), s({N, Kp / kNvfp4Block});
          repack_nvfp4_x4(codes.data(), scales.data(), N, Kp, c.mutable_data(), s.mutable_data());
          return py::make_tuple(c, s);
        }, py::arg("codes"), py::arg("scales"),
        "NVFP4 file layout -> the Nvfp4X4 layout (kernels.h): (codes, scales) of the same shapes.");
  k.def("repack_q4_1_x8", [](const Arr<uint8_t>& codes) {
          require(codes.ndim() == 2 && codes.shape(1) * 2 % kQuantPad == 0,
                  "w4a8 codes u8 [N, Kp/2] with Kp a multiple of 32");
          const int N = int(codes.shape(0)), Kp = int(codes.shape(1)) * 2;
          py::array_t<uint8_t> c({N, Kp / 2});
          repack_q4_1_x8(codes.data(), N, Kp, c.mutable_data());
          return c;
        }, py::arg("codes"),
        "GGUF Q4_1 (w4a8 + mins) codes, file layout -> the Q41X8 layout (kernels.h), same shape.");
  k.def("preferred_layout_a16", [](const std::string& dtype, bool mins) {
          WeightView w;
          w.dtype = parse_dtype(dtype);
          static const uint16_t one = 0x3C00;
          w.mins = mins ? &one : nullptr;
          return preferred_layout_a16(w) == WeightLayout::Q41X8 ? std::string("q4_1_x8") : std::string("file");
        }, py::arg("dtype"), py::arg("mins") = true,
        "The layout the active kernel set repacks weights of this dtype into at load on activations a16.");
  k.def("preferred_layout", [](const std::string& dtype) {
          WeightView w;
          w.dtype = parse_dtype(dtype);
          return preferred_layout(w) == WeightLayout::Nvfp4X4 ? std::string("nvfp4_x4") : std::string("file");
        }, py::arg("dtype"), "The layout the active kernel set repacks weights of this dtype into at load.");
  k.def("attention", &py_attention, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("pages"),
        py::kw_only(), py::arg("g") = 0, py::arg("ctx"), py::arg("ref") = false,
        "Causal attention of one query (q f32 [G, D], the heads of KV head g) over ctx tokens of\n"
        "paged k, v (f32|f16 [n_pages, block, nkv, D]); ref=True runs the portable kernel.");
  k.def("attention_scores_int8", [](const std::string& kv, int D, int block) {
          cpu::KvView v;
          v.dtype = kv == "nvfp4" ? KvDType::NVFP4 : kv == "f16" ? KvDType::F16 : KvDType::F32;
          v.D = D, v.block = block;
          return cpu::attention_scores_int8(v);
        }, py::arg("kv"), py::arg("D"), py::arg("block") = 16,
        "Whether decode attention over pages of this format scores with int8 q (ops_cpu.h).");
  k.def("kernel_isa", []() { return std::string(kernel_isa()); });
  k.def("set_kernel_isa", [](const std::string& name) { return set_kernel_isa(name.c_str()); },
        py::arg("name"));
  k.def("cpu_supports", [](const std::string& name) { return cpu_supports(name.c_str()); },
        py::arg("name"));
}
