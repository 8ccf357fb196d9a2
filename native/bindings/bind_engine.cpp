// Python bindings of the engine: thin handles, no logic.
//
// GIL rule: every call that takes the engine's lock releases the GIL first, so a thread
// waiting for a running forward() never holds up the other Python threads (the UI). The
// published reads (snapshot, tree_dump, drain_events, dropped_events) take only the short
// publication lock.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "kvdeck/engine.h"
#include "kvdeck/kernels.h"
#include "kvdeck/ops_cpu.h"
#include "kvdeck/sampler.h"
#include "kvdeck/weights_loader.h"

namespace py = pybind11;
using namespace kvdeck;

namespace {

template <typename T>
T get_or(const py::dict& d, const char* key, T fallback) {
  return d.contains(key) ? d[key].cast<T>() : fallback;
}

ModelConfig config_from(const py::dict& d) {
  ModelConfig c;
  c.hidden = d["hidden"].cast<int>();
  c.intermediate = d["intermediate"].cast<int>();
  c.n_layers = d["n_layers"].cast<int>();
  c.n_heads = d["n_heads"].cast<int>();
  c.n_kv_heads = d["n_kv_heads"].cast<int>();
  c.head_dim = d["head_dim"].cast<int>();
  c.vocab = d["vocab"].cast<int>();
  c.rms_eps = d["rms_eps"].cast<float>();
  c.attn_bias = get_or<bool>(d, "attn_bias", false);
  c.qk_norm = get_or<bool>(d, "qk_norm", false);
  c.rope_inv_freq = d["rope_inv_freq"].cast<std::vector<float>>();
  return c;
}

KvDType kv_dtype_from(const std::string& s) {
  if (s == "f32") return KvDType::F32;
  if (s == "f16") return KvDType::F16;
  if (s == "nvfp4") return KvDType::NVFP4;
  if (s == "nvfp4r") return KvDType::NVFP4R;
  if (s == "k8v4") return KvDType::K8V4;
  if (s == "kpc4") return KvDType::KPC4;
  throw std::invalid_argument("kv format '" + s + "' is not supported (f32, f16, nvfp4, nvfp4r, k8v4, kpc4)");
}

EngineOptions options_from(const py::dict& d) {
  EngineOptions o;
  o.backend = get_or<std::string>(d, "backend", o.backend);
  o.threads = get_or<int>(d, "threads", o.threads);
  o.kv_dtype = kv_dtype_from(get_or<std::string>(d, "kv", "f32"));
  o.kv_block = get_or<int>(d, "kv_block", o.kv_block);
  o.kv_pages = get_or<int>(d, "kv_pages", o.kv_pages);
  o.max_context = get_or<int>(d, "max_context", o.max_context);
  o.max_chunk = get_or<int>(d, "max_chunk", o.max_chunk);
  o.prefix_cache = get_or<bool>(d, "prefix_cache", o.prefix_cache);
  const std::string act = get_or<std::string>(d, "activations", "a8");
  if (act != "a8" && act != "a16")
    throw std::invalid_argument("engine option activations = '" + act + "' is not supported (a8, a16)");
  o.act_bits = act == "a16" ? 16 : 8;
  return o;
}


}  // namespace

void bind_engine(py::module_& m) {
  py::register_exception<KvPoolFull>(m, "KvPoolFullError", PyExc_RuntimeError);
  // CancelledError(tokens appended before the cancel). The type object is kept for the
  // process's lifetime (module attribute + one leaked reference: no destructor at exit).
  static PyObject* cancelled_type = [&] {
    py::exception<Cancelled> exc(m, "CancelledError", PyExc_RuntimeError);
    return exc.inc_ref().ptr();
  }();
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Cancelled& e) {
      PyErr_SetObject(cancelled_type, py::make_tuple(e.computed).ptr());
    }
  });

  py::class_<CancelFlag>(m, "CancelFlag", "Set from any thread to stop a forward() between layers.")
      .def(py::init<>())
      .def("set", [](CancelFlag& f) { f.set.store(true); })
      .def("clear", [](CancelFlag& f) { f.set.store(false); })
      .def_property_readonly("is_set", [](const CancelFlag& f) { return f.set.load(); });

  py::class_<Engine>(m, "Engine")
      .def(py::init([](const py::dict& config, const py::dict& options) {
             return std::make_unique<Engine>(config_from(config), options_from(options));
           }),
           py::arg("config"), py::arg("options"))
      .def("open_sequence", &Engine::open_sequence, py::arg("session") = 0, py::call_guard<py::gil_scoped_release>())
      .def("close_sequence", &Engine::close_sequence, py::call_guard<py::gil_scoped_release>())
      .def("sequence_tokens", [](const Engine& e, int s) { return e.sequence(s).tokens; })
      .def("sequence_pages", [](const Engine& e, int s) { return e.sequence(s).pages; })
      .def(
          "forward",
          [](Engine& e, int seq, py::array_t<int32_t, py::array::c_style | py::array::forcecast> ids,
             bool all_logits, const CancelFlag* cancel) {
            const int n = int(ids.size());
            const int V = e.config().vocab;
            py::array_t<float> out = all_logits ? py::array_t<float>({n, V}) : py::array_t<float>(V);
            const int32_t* p = ids.data();
            float* o = out.mutable_data();
            {
              py::gil_scoped_release nogil;
              e.forward(seq, p, n, o, all_logits, cancel);
            }
            return out;
          },
          py::arg("seq"), py::arg("ids"), py::arg("all_logits") = false, py::arg("cancel") = nullptr,
          "Append ids to the sequence and compute them; logits f32 [V] of the last token, "
          "or [n, V] with all_logits. Raises CancelledError(tokens appended) when cancel is set.")
      .def(
          "forward_greedy",
          [](Engine& e, int seq, py::array_t<int32_t, py::array::c_style | py::array::forcecast> ids,
             const CancelFlag* cancel) {
            const int n = int(ids.size());
            const int32_t* p = ids.data();
            int32_t tok = 0;
            {
              py::gil_scoped_release nogil;
              e.forward(seq, p, n, nullptr, false, cancel, &tok);
            }
            return tok;
          },
          py::arg("seq"), py::arg("ids"), py::arg("cancel") = nullptr,
          "forward() returning the last token's argmax, reduced on the backend (no logits download).")
      .def(
          "forward_sample",
          [](Engine& e, int seq, py::array_t<int32_t, py::array::c_style | py::array::forcecast> ids, Sampler& sampler,
             float temperature, int top_k, float top_p, py::object mask, const CancelFlag* cancel) {
            const int n = int(ids.size());
            const int V = e.config().vocab;
            SampleRequest req;
            req.params = SamplingParams{temperature, top_k, top_p};
            check_sampling(req.params);
            std::vector<uint32_t> bits;
            if (!mask.is_none()) {  // bool [V] -> u32 bits (Backend::sample's layout)
              auto m = py::array_t<bool, py::array::c_style | py::array::forcecast>::ensure(mask);
              if (!m || m.ndim() != 1 || m.shape(0) != V)
                throw std::invalid_argument("mask must be a bool array of the vocabulary's " + std::to_string(V) +
                                            " entries");
              bits.assign((size_t(V) + 31) / 32, 0u);
              const bool* b = m.data();
              for (int i = 0; i < V; ++i) bits[i / 32] |= uint32_t(b[i]) << (i % 32);
              req.mask = bits.data();
            }
            if (temperature > 0.0f) req.u = sampler.uniform();  // the draw Sampler.sample makes
            const int32_t* p = ids.data();
            int32_t tok = 0;
            {
              py::gil_scoped_release nogil;
              e.forward(seq, p, n, nullptr, false, cancel, &tok, &req);
            }
            return tok;
          },
          py::arg("seq"), py::arg("ids"), py::arg("sampler"), py::arg("temperature") = 0.0f, py::arg("top_k") = 0,
          py::arg("top_p") = 1.0f, py::arg("mask") = py::none(), py::arg("cancel") = nullptr,
          "forward() then the next token chosen on the backend as Sampler.sample would choose it from the "
          "logits with the tokens where mask (bool [V]) is False set to -inf: one id comes back, not [V] logits.")
      .def(
          "begin",
          [](Engine& e, int seq, py::array_t<int32_t, py::array::c_style | py::array::forcecast> ids) {
            py::gil_scoped_release nogil;
            return e.begin(seq, ids.data(), int(ids.size()));
          },
          py::arg("seq"), py::arg("ids"), "Attach the longest cached prefix; returns cached tokens.")
      .def("finish", &Engine::finish, py::arg("seq"), py::call_guard<py::gil_scoped_release>(), "Insert the sequence's whole pages into the cache and close it.")
      .def(
          "pin",
          [](Engine& e, int session, py::array_t<int32_t, py::array::c_style | py::array::forcecast> ids) {
            py::gil_scoped_release nogil;
            return e.pin(session, ids.data(), int(ids.size()));
          },
          py::arg("session"), py::arg("ids"), "Pin the cached prefix of ids; returns (pin id, tokens pinned).")
      .def("unpin", &Engine::unpin, py::arg("pin_id"), py::call_guard<py::gil_scoped_release>())
      .def("release_session", &Engine::release_session, py::arg("session"), py::call_guard<py::gil_scoped_release>(),
           "Unpin all of a session's pins.")
      .def("evict", &Engine::evict, py::arg("n_pages"), py::arg("reason") = "requested",
           py::call_guard<py::gil_scoped_release>())
      .def("clear_cache", &Engine::clear_cache, py::call_guard<py::gil_scoped_release>())
      .def("check_integrity", &Engine::check_integrity, py::call_guard<py::gil_scoped_release>())
      .def("snapshot",
           [](const Engine& e) {
             const PoolSnapshot s = e.snapshot();
             py::dict d;
             d["total_pages"] = s.total_pages;
             d["used_pages"] = s.used_pages;
             d["free_pages"] = s.free_pages;
             d["pinned_pages"] = s.pinned_pages;
             d["evictable_pages"] = s.evictable_pages;
             d["locked_pages"] = s.locked_pages;
             d["cached_pages"] = s.cached_pages;
             d["tree_nodes"] = s.tree_nodes;
             d["block"] = s.block;
             d["bytes_per_token"] = s.bytes_per_token;
             d["kv_staged_pages"] = s.staged_pages;      // kpc4: open pages held unrounded
             d["kv_staging_bytes"] = s.staging_bytes;
             return d;
           })
      .def("tree_dump",
           [](const Engine& e) {
             py::list out;
             for (const NodeInfo& n : e.tree_nodes()) {
               py::dict d;
               d["id"] = n.id;
               d["parent"] = n.parent;
               d["start"] = n.start;
               d["tokens"] = n.tokens;
               d["pages"] = n.pages;
               d["lock_ref"] = n.lock_ref;
               d["pin_ref"] = n.pin_ref;
               d["last_access"] = n.last_access;
               d["owner"] = n.owner;
               out.append(d);
             }
             return out;
           })
      .def("drain_events",
           [](Engine& e) {
             py::list out;
             for (const CacheEvent& ev : e.drain_events()) {
               py::dict d;
               d["kind"] = cache_event_name(ev.kind);
               d["session"] = ev.session;
               d["pages"] = ev.pages;
               d["tokens"] = ev.tokens;
               d["prefix_tokens"] = ev.prefix_tokens;
               d["head"] = ev.head;
               d["reason"] = ev.reason;
               out.append(d);
             }
             return out;
           })
      .def_property_readonly("dropped_events", &Engine::dropped_events, "cache events lost to a full ring")
      .def("progress",
           [](const Engine& e) -> py::object {
             const ForwardProgress p = e.progress();
             if (p.seq == 0) return py::none();
             py::dict d;
             d["seq"] = p.seq;
             d["total"] = p.total;
             d["done"] = p.done;
             d["chunk"] = p.chunk;
             d["layer"] = p.layer;
             d["layers"] = p.layers;
             return d;
           },
           "The prefill in flight {seq, total, done, chunk, layer, layers}, or None (never waits).")
      .def_property_readonly("backend", &Engine::backend_name)
      .def_property_readonly("threads", &Engine::threads)
      .def_property_readonly("weight_bytes", &Engine::weight_bytes)
      .def_property_readonly("kv_block", &Engine::kv_block)
      .def_property_readonly("kv_pages", [](const Engine& e) { return e.snapshot().total_pages; })
      .def_property_readonly("kv_free_pages", [](const Engine& e) { return e.snapshot().free_pages; })
      .def_property_readonly("kv_used_pages", [](const Engine& e) { return e.snapshot().used_pages; })
      .def_property_readonly("kv_bytes_per_token", [](const Engine& e) { return e.snapshot().bytes_per_token; })
      .def_property_readonly("kv_format", [](const Engine& e) { return std::string(kv_dtype_name(e.kv_dtype())); })
      .def_property_readonly("activations", [](const Engine& e) { return std::string(e.act_bits() == 16 ? "a16" : "a8"); });

  py::class_<Sampler>(m, "Sampler")
      .def(py::init<uint64_t>(), py::arg("seed") = 0)
      .def(
          "sample",
          [](Sampler& s, py::array_t<float, py::array::c_style | py::array::forcecast> logits,
             float temperature, int top_k, float top_p) {
            SamplingParams p{temperature, top_k, top_p};
            return s.sample(logits.data(), int(logits.size()), p);
          },
          py::arg("logits"), py::arg("temperature") = 0.0f, py::arg("top_k") = 0, py::arg("top_p") = 1.0f)
      .def("uniform", &Sampler::uniform, "The draw sample() makes for a sampled token: U[0, 1).");

  m.def("kernel_isa", [] { return std::string(kernel_isa()); });
  m.def(
      "kv_nvfp4_roundtrip",
      [](py::array_t<float, py::array::c_style | py::array::forcecast> x) {
        // x f32 [n, D] -> (rows u8 [n, D/2 + D/16], decoded f32 [n, D]); for tests.
        if (x.ndim() != 2 || x.shape(1) % 16) throw std::invalid_argument("x must be [n, D] with D % 16 == 0");
        const int n = int(x.shape(0)), D = int(x.shape(1));
        py::array_t<uint8_t> rows({n, D / 2 + D / 16});
        py::array_t<float> back({n, D});
        for (int i = 0; i < n; ++i) {
          cpu::kv_nvfp4_encode_row(x.data() + size_t(i) * D, D, rows.mutable_data() + size_t(i) * (D / 2 + D / 16));
          cpu::kv_nvfp4_decode_row(rows.data() + size_t(i) * (D / 2 + D / 16), D, back.mutable_data() + size_t(i) * D);
        }
        return py::make_tuple(rows, back);
      },
      py::arg("x"));
  m.def(
      "kv_roundtrip",
      [](const std::string& fmt, bool v, py::array_t<float, py::array::c_style | py::array::forcecast> x) {
        // x f32 [n, D] -> (rows u8 [n, row bytes], decoded f32 [n, D]): a K (v=False) or V row
        // of any KV format, through the codec kv_write / attention use; for tests.
        const KvDType t = kv_dtype_from(fmt);
        if (x.ndim() != 2 || x.shape(1) % 16) throw std::invalid_argument("x must be [n, D] with D % 16 == 0");
        const int n = int(x.shape(0)), D = int(x.shape(1));
        const size_t rb = kv_row_bytes(t, D, v);
        py::array_t<uint8_t> rows({size_t(n), rb});
        py::array_t<float> back({n, D});
        for (int i = 0; i < n; ++i) {
          cpu::kv_encode_row(t, v, x.data() + size_t(i) * D, D, rows.mutable_data() + i * rb);
          cpu::kv_decode_row(t, v, rows.data() + i * rb, D, back.mutable_data() + size_t(i) * D);
        }
        return py::make_tuple(rows, back);
      },
      py::arg("fmt"), py::arg("v"), py::arg("x"));
}
