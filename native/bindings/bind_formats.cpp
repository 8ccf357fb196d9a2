// bind_formats.cpp — app.engine._native.formats: numpy-vectorised number-format codecs.
//
// Binding code only: shape checks, allocation, GIL release, calls into kvdeck/formats.h.
// Array arguments are converted (forcecast) to C-contiguous arrays of the codec's dtype.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <vector>

#include "kvdeck/formats.h"

namespace py = pybind11;

namespace {

template <typename T>
using carray = py::array_t<T, py::array::c_style | py::array::forcecast>;

std::vector<py::ssize_t> shape_of(const py::array& a) {
  return std::vector<py::ssize_t>(a.shape(), a.shape() + a.ndim());
}

// Elementwise codec In -> Out over an array of any shape; the result has the same shape.
template <typename In, typename Out, void (*Fn)(const In*, Out*, size_t)>
py::array_t<Out> map_codec(carray<In> x) {
  py::array_t<Out> y(shape_of(x));
  const In* src = x.data();
  Out* dst = y.mutable_data();
  const size_t n = size_t(x.size());
  py::gil_scoped_release nogil;
  Fn(src, dst, n);
  return y;
}

// A float16 array is accepted as its uint16 bit pattern (no value conversion).
carray<uint16_t> as_f16_bits(py::array a) {
  if (a.dtype().is(py::dtype("float16"))) a = a.attr("view")("uint16");
  return carray<uint16_t>::ensure(a);
}

void check_2d(const py::array& a, const char* name) {
  if (a.ndim() != 2) throw py::value_error(std::string(name) + " must be a 2-D array");
}

// "mse" / "amax" -> kvdeck::QuantRecipe (models.quant's recipe names).
kvdeck::QuantRecipe parse_recipe(const std::string& r) {
  if (r == "mse") return kvdeck::QuantRecipe::Mse;
  if (r == "amax") return kvdeck::QuantRecipe::Amax;
  throw py::value_error("unknown quantisation recipe '" + r + "'; expected 'mse' or 'amax'");
}

}  // namespace

void bind_formats(py::module_& m) {
  using namespace kvdeck;
  py::module_ f = m.def_submodule("formats", "Number-format codecs (C++ twins of models.quant)");

  f.attr("NVFP4_BLOCK") = kNvfp4Block;
  f.attr("Q8_BLOCK") = kQ8Block;
  f.attr("QUANT_PAD") = kQuantPad;

  // ---- elementwise codecs -----------------------------------------------------------
  f.def("encode_f16", &map_codec<float, uint16_t, encode_f16>, py::arg("x"),
        "f32 array -> uint16 IEEE half bits (RNE, overflow to inf, NaN payload top bits kept)");
  f.def(
      "decode_f16",
      [](py::array h) {
        carray<uint16_t> hb = as_f16_bits(h);
        return map_codec<uint16_t, float, decode_f16>(hb);
      },
      py::arg("h"), "uint16 (or float16) half bits -> f32 array");
  f.def("encode_e4m3", &map_codec<float, uint8_t, encode_e4m3>, py::arg("x"),
        "f32 array -> uint8 float8_e4m3fn codes (RNE, saturate ±448, NaN -> 0x7F|sign)");
  f.def("decode_e4m3", &map_codec<uint8_t, float, decode_e4m3>, py::arg("b"),
        "uint8 e4m3fn codes -> f32 array (0x7F/0xFF -> NaN)");
  f.def("encode_e2m1", &map_codec<float, uint8_t, encode_e2m1>, py::arg("x"),
        "f32 array -> uint8 E2M1 codes in [0,16) (RNE on the grid, saturate ±6)");
  f.def("decode_e2m1", &map_codec<uint8_t, float, decode_e2m1>, py::arg("c"),
        "uint8 E2M1 codes (low nibble) -> f32 array");

  // ---- NVFP4 --------------------------------------------------------------------------
  f.def(
      "nvfp4_quantize",
      [](carray<float> w, const std::string& recipe) {
        check_2d(w, "w");
        const QuantRecipe rc = parse_recipe(recipe);
        const int N = int(w.shape(0)), K = int(w.shape(1)), Kp = round_up(K, kQuantPad);
        py::array_t<uint8_t> codes({N, Kp / 2});           // codes: u8 [N, Kp/2]
        py::array_t<uint8_t> scales({N, Kp / kNvfp4Block});  // scales: u8 [N, Kp/16]
        float tscale = 1.0f;
        const float* src = w.data();
        uint8_t* c = codes.mutable_data();
        uint8_t* s = scales.mutable_data();
        {
          py::gil_scoped_release nogil;
          nvfp4_quantize(src, N, K, c, s, &tscale, rc);
        }
        return py::make_tuple(codes, scales, tscale);
      },
      py::arg("w"), py::arg("recipe") = "mse",
      "f32 [N,K] -> (codes u8 [N,Kp/2], scales u8 e4m3 [N,Kp/16], tscale float); recipe 'mse' | 'amax'");
  f.def(
      "nvfp4_dequantize",
      [](carray<uint8_t> codes, carray<uint8_t> scales, float tscale, int K) {
        check_2d(codes, "codes");
        check_2d(scales, "scales");
        const int N = int(codes.shape(0)), Kp = round_up(K, kQuantPad);
        if (codes.shape(1) != Kp / 2 || scales.shape(0) != N || scales.shape(1) != Kp / kNvfp4Block)
          throw py::value_error("nvfp4_dequantize: codes/scales shapes do not match K");
        py::array_t<float> w({N, K});  // w: f32 [N, K]
        const uint8_t* c = codes.data();
        const uint8_t* s = scales.data();
        float* dst = w.mutable_data();
        {
          py::gil_scoped_release nogil;
          nvfp4_dequantize(c, s, tscale, N, K, dst);
        }
        return w;
      },
      py::arg("codes"), py::arg("scales"), py::arg("tscale"), py::arg("K"),
      "(codes u8 [N,Kp/2], scales u8 [N,Kp/16], tscale, K) -> f32 [N,K]");

  // ---- W4A8 ---------------------------------------------------------------------------
  f.def(
      "w4a8_quantize",
      [](carray<float> w, py::object group, const std::string& recipe) {
        check_2d(w, "w");
        const QuantRecipe rc = parse_recipe(recipe);
        const int N = int(w.shape(0)), K = int(w.shape(1)), Kp = round_up(K, kQuantPad);
        const int g = group.is_none() ? 0 : group.cast<int>();
        const int G = g <= 0 ? Kp : g;
        if (G <= 0 || G % 2 != 0 || Kp % G != 0)
          throw py::value_error("w4a8 group must be even and divide Kp");
        py::array_t<uint8_t> codes({N, Kp / 2});                 // codes: u8 [N, Kp/2]
        py::array scales(py::dtype("float16"), std::vector<py::ssize_t>{N, Kp / G});  // f16 [N, Kp/G]
        const float* src = w.data();
        uint8_t* c = codes.mutable_data();
        uint16_t* s = static_cast<uint16_t*>(scales.mutable_data());
        {
          py::gil_scoped_release nogil;
          w4a8_quantize(src, N, K, G, c, s, rc);
        }
        return py::make_tuple(codes, scales);
      },
      py::arg("w"), py::arg("group") = 32, py::arg("recipe") = "mse",
      "f32 [N,K] -> (codes u8 [N,Kp/2] nibble q+8, scales f16 [N,Kp/group]); group None/0: row-wise; "
      "recipe 'mse' | 'amax'");
  f.def(
      "w4a8_dequantize",
      [](carray<uint8_t> codes, py::array scales, int K) {
        carray<uint16_t> sb = as_f16_bits(scales);
        check_2d(codes, "codes");
        check_2d(sb, "scales");
        const int N = int(codes.shape(0)), Kp = round_up(K, kQuantPad);
        const int ng = int(sb.shape(1));
        if (codes.shape(1) != Kp / 2 || sb.shape(0) != N || ng <= 0 || Kp % ng != 0)
          throw py::value_error("w4a8_dequantize: codes/scales shapes do not match K");
        py::array_t<float> w({N, K});  // w: f32 [N, K]
        const uint8_t* c = codes.data();
        const uint16_t* s = sb.data();
        float* dst = w.mutable_data();
        {
          py::gil_scoped_release nogil;
          w4a8_dequantize(c, s, N, K, Kp / ng, dst);
        }
        return w;
      },
      py::arg("codes"), py::arg("scales"), py::arg("K"),
      "(codes u8 [N,Kp/2], scales f16 [N,Kp/group], K) -> f32 [N,K]; group = Kp / scales.shape[1]");
}
