// Python bindings of the KPC4 K page codec (kvdeck/kv_pce.h), for its tests against a float64
// reference (tests/native/test_kv_pce.py). No logic here beyond the copies and shape checks.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>

#include "kvdeck/kernels.h"
#include "kvdeck/kv_pce.h"

namespace py = pybind11;
using namespace kvdeck;

namespace {
template <typename T>
using Arr = py::array_t<T, py::array::c_style | py::array::forcecast>;
}

void bind_kv_pce(py::module_& m) {
  m.def(
      "kpc4_encode_page",
      [](const Arr<float>& x) {
        if (x.ndim() != 2 || x.shape(0) != cpu::kPceTokens || x.shape(1) % 16 != 0)
          throw std::invalid_argument("kpc4_encode_page: x must be f32 [16, D] with D a multiple of 16");
        const int D = int(x.shape(1));
        py::array_t<uint8_t> out(py::ssize_t(cpu::kpc4_head_bytes(D)));
        cpu::kpc4_encode_page(x.data(), size_t(D), D, out.mutable_data());
        return out;
      },
      py::arg("x"), "One KV head's K page [16, D] -> its KPC4 bytes [10 D] (codes, E4M3 lo, E4M3 step).");
  m.def(
      "kpc4_decode_page",
      [](const Arr<uint8_t>& b, int D, int n, const std::string& isa) {
        if (D <= 0 || D % 16 != 0 || b.ndim() != 1 || size_t(b.shape(0)) != cpu::kpc4_head_bytes(D))
          throw std::invalid_argument("kpc4_decode_page: bytes must be [10 D] with D a multiple of 16");
        if (n < 0 || n > cpu::kPceTokens) throw std::invalid_argument("kpc4_decode_page: n must be 0..16");
        cpu::Kpc4DecodeFn fn = cpu::kpc4_decode_page_ref;
        if (isa == "avx2") {
#if defined(__x86_64__)
          if (!cpu_supports("avx2")) throw std::invalid_argument("kpc4_decode_page: this CPU has no avx2");
          fn = cpu::kpc4_decode_page_avx2;
#else
          throw std::invalid_argument("kpc4_decode_page: avx2 is an x86-64 path");
#endif
        } else if (isa != "scalar") {
          throw std::invalid_argument("kpc4_decode_page: isa must be scalar or avx2, got '" + isa + "'");
        }
        py::array_t<float> out({py::ssize_t(n), py::ssize_t(D)});
        fn(b.data(), D, n, out.mutable_data(), size_t(D));
        return out;
      },
      py::arg("b"), py::arg("D"), py::arg("n") = 16, py::arg("isa") = "scalar",
      "KPC4 page bytes -> its first n K rows f32 [n, D] through the scalar reference or the AVX2 decoder.");
}
