// make_backend: the backends this build has, by name (backend.h).
#include <stdexcept>

#include "kvdeck/backend.h"

namespace kvdeck {

std::vector<std::string> built_backends() {
#ifdef KVDECK_HAVE_CUDA
  return {"cpu", "cuda"};
#else
  return {"cpu"};
#endif
}

std::vector<std::string> usable_backends() {
  std::vector<std::string> out{"cpu"};
#ifdef KVDECK_HAVE_CUDA
  if (cuda_device_status().empty()) out.push_back("cuda");
#endif
  return out;
}

std::unique_ptr<Backend> make_backend(const std::string& name, int threads) {
  if (name == "cpu") return make_cpu_backend(threads);
#ifdef KVDECK_HAVE_CUDA
  if (name == "cuda") return make_cuda_backend(threads);
#endif
  std::string have;
  for (const std::string& b : built_backends()) have += (have.empty() ? "" : ", ") + b;
  throw std::invalid_argument("backend '" + name + "' is not available in this build (available: " + have + ")");
}

}  // namespace kvdeck
