// The Python module app.engine._native. Each bind_*.cpp exports one area; nothing here
// but the registration.
#include <pybind11/pybind11.h>

namespace py = pybind11;

void bind_formats(py::module_& m);
void bind_kernels(py::module_& m);
void bind_engine(py::module_& m);
void bind_loader(py::module_& m);
void bind_backend(py::module_& m);
void bind_kv_pce(py::module_& m);

PYBIND11_MODULE(_native, m) {
  m.doc() = "kvdeck native engine (C++): formats, CPU kernels, engine";
  bind_formats(m);
  bind_kernels(m);
  bind_engine(m);
  bind_loader(m);
  bind_backend(m);
  bind_kv_pce(m);
}
