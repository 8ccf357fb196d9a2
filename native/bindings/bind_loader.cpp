// bind_loader.cpp — Python class `_native.WeightsBuilder`: upload a model one tensor at a
// time (kvdeck/weights_loader.h). Binding code only: array checks and GIL release.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "kvdeck/engine.h"
#include "kvdeck/weights_loader.h"

namespace py = pybind11;
using namespace kvdeck;

namespace {

std::string dtype_of(const py::array& a) {
  const char k = a.dtype().kind();
  const auto size = a.dtype().itemsize();
  if (k == 'f' && size == 4) return "f32";
  if (k == 'f' && size == 2) return "f16";
  if (k == 'u' && size == 1) return "u8";
  if (k == 'i' && size == 1) return "i8";
  return std::string(1, k) + std::to_string(size);
}

}  // namespace

void bind_loader(py::module_& m) {
  py::class_<WeightsBuilder>(m, "WeightsBuilder",
                             "Upload a model tensor by tensor: add(name, array) copies the array into the "
                             "engine before it returns (the caller may drop it), finish() installs the weights.")
      .def(py::init([](Engine& e, bool tie) { return std::make_unique<WeightsBuilder>(e, tie); }),
           py::arg("engine"), py::arg("tie_embeddings"), py::keep_alive<1, 2>())
      .def(
          "add",
          [](WeightsBuilder& b, const std::string& name, const py::array& array) {
            // A C-contiguous view of the caller's buffer (a copy only if it was strided).
            py::array a = py::array::ensure(array, py::array::c_style);
            if (!a) throw std::invalid_argument("weights: tensor " + name + " is not an array");
            HostTensor h;
            h.data = a.data();
            h.dtype = dtype_of(a);
            h.nbytes = size_t(a.nbytes());
            for (py::ssize_t i = 0; i < a.ndim(); ++i) h.shape.push_back(a.shape(i));
            py::gil_scoped_release nogil;  // `a` keeps the buffer alive; it is not touched from Python
            b.add(name, h);
          },
          py::arg("name"), py::arg("array"))
      .def(
          "finish", [](WeightsBuilder& b) { b.finish(); }, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("count", &WeightsBuilder::count)
      .def_property_readonly("uploaded_bytes", &WeightsBuilder::uploaded_bytes);
}
