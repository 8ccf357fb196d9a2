// Python bindings of one Backend's ops, for the backend-vs-reference op tests
// (tests/native/test_backend_ops.py, after llama.cpp's test-backend-ops): every op of
// kvdeck/backend.h on numpy inputs, copied into backend memory, run, copied back.
// No logic here beyond the copies; shapes are checked so a wrong call raises, never crashes.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>  // attention_timing
#include <random>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "kvdeck/backend.h"
#include "kvdeck/formats.h"
#include "kvdeck/kv_pool.h"

namespace py = pybind11;
using namespace kvdeck;

namespace {

template <typename T>
using Arr = py::array_t<T, py::array::c_style | py::array::forcecast>;

void require(bool ok, const char* msg) {
  if (!ok) throw std::invalid_argument(msg);
}

// A backend with device buffers that live as long as one op call.
class BackendOps {
 public:
  BackendOps(const std::string& name, int threads) : be_(make_backend(name, threads)) {}
  ~BackendOps() { release(); }

  std::string name() const { return be_->name(); }

  template <typename T>
  T* put(const Arr<T>& a) {
    void* p = be_->alloc(std::max<size_t>(1, a.nbytes()));
    be_->upload(p, a.data(), a.nbytes());
    bufs_.push_back(p);
    return static_cast<T*>(p);
  }
  void* put_raw(const py::array& a) {  // the array's bytes, C order
    const py::array c = py::array::ensure(a, py::array::c_style);
    void* p = be_->alloc(std::max<size_t>(1, c.nbytes()));
    be_->upload(p, c.data(), c.nbytes());
    bufs_.push_back(p);
    return p;
  }
  float* scratch(size_t n) {
    void* p = be_->alloc(n * sizeof(float));
    bufs_.push_back(p);
    return static_cast<float*>(p);
  }
  py::array_t<float> get(const float* d, std::vector<py::ssize_t> shape) {
    py::array_t<float> out(shape);
    be_->sync();
    be_->download(out.mutable_data(), d, out.nbytes());
    return out;
  }
  void release() {
    for (void* p : bufs_) be_->free(p);
    bufs_.clear();
  }
  Backend& be() { return *be_; }

 private:
  std::unique_ptr<Backend> be_;
  std::vector<void*> bufs_;
};

// A KV pool format by its name (kv_pool.h), or std::invalid_argument.
KvDType kv_of(const std::string& kv) {
  for (KvDType t : {KvDType::F32, KvDType::F16, KvDType::NVFP4, KvDType::NVFP4R, KvDType::K8V4, KvDType::KPC4})
    if (kv == kv_dtype_name(t)) return t;
  throw std::invalid_argument("kv must be f32, f16, nvfp4, nvfp4r, k8v4 or kpc4, got '" + kv + "'");
}

struct Release {  // frees an op's buffers however it ends
  BackendOps& o;
  ~Release() { o.release(); }
};

// attention / attention_fresh on numpy inputs: q f32 [M, nh*D] at positions p0..p0+M-1; k, v
// f32 [ctx, nkv, D] (ctx = p0 + M) written into a pool of `kv` pages (block 16) with kv_write;
// with `fresh` the chunk's own rows (positions >= p0) are passed unrounded as k_new / v_new.
py::array_t<float> attention_op(BackendOps& o, const Arr<float>& q, const Arr<float>& k, const Arr<float>& v, int p0,
                                const std::string& kv, bool fresh) {
  Release r{o};
  require(q.ndim() == 2 && k.ndim() == 3 && v.ndim() == 3, "q [M, nh*D], k, v [ctx, nkv, D]");
  const int M = int(q.shape(0)), ctx = int(k.shape(0)), nkv = int(k.shape(1)), D = int(k.shape(2));
  require(ctx == p0 + M && v.shape(0) == ctx && q.shape(1) % D == 0, "ctx must be p0 + M");
  const int nh = int(q.shape(1)) / D, B = 16, n_pages = (ctx + B - 1) / B;
  const KvDType dt = kv_of(kv);
  KvPool pool(o.be(), 1, nkv, D, B, n_pages, dt);
  std::vector<int32_t> pages(n_pages), slots(ctx), pos(M);
  for (int i = 0; i < n_pages; ++i) pages[i] = pool.alloc_page();
  for (int t = 0; t < ctx; ++t) slots[t] = pages[t / B] * B + t % B;
  for (int i = 0; i < M; ++i) pos[i] = p0 + i;
  auto dev_i32 = [&](const std::vector<int32_t>& h) {
    return o.put(Arr<int32_t>(py::array_t<int32_t>(py::ssize_t(h.size()), h.data())));
  };
  float *kd = o.put(k), *vd = o.put(v);
  o.be().kv_write(pool, 0, kd, vd, nkv * D, dev_i32(slots), ctx);
  float* out = o.scratch(size_t(M) * nh * D);
  if (fresh)
    o.be().attention_fresh(pool, 0, o.put(q), nh * D, M, dev_i32(pos), dev_i32(pages), nh, nkv, D,
                           kd + size_t(p0) * nkv * D, vd + size_t(p0) * nkv * D, nkv * D, out);
  else
    o.be().attention(pool, 0, o.put(q), nh * D, M, dev_i32(pos), dev_i32(pages), nh, nkv, D, out);
  return o.get(out, {M, py::ssize_t(nh) * D});
}

}  // namespace

void bind_backend(py::module_& m) {
  py::class_<BackendOps>(m, "BackendOps", "One backend's ops on numpy arrays (tests).")
      .def(py::init<const std::string&, int>(), py::arg("name") = "cpu", py::arg("threads") = 0)
      .def_property_readonly("name", &BackendOps::name)
      .def("attention_fresh",
           [](BackendOps& o, const Arr<float>& q, const Arr<float>& k, const Arr<float>& v, int p0,
              const std::string& kv) { return attention_op(o, q, k, v, p0, kv, true); },
           py::arg("q"), py::arg("k"), py::arg("v"), py::arg("p0"),
           py::arg("kv") = "f32", "attention() with the chunk's own rows unrounded (Backend::attention_fresh)")
      .def(
          "attention_timing",
          [](BackendOps& o, int nh, int nkv, int D, int p0, int M, const std::string& kv, int layers, int repeat,
             bool fresh, uint32_t seed) {
            // Benchmark (app/bench/attention.py): `layers` layers of random K/V (normal, as f32
            // [ctx, nkv, D] written with kv_write, ctx = p0 + M), random q [M, nh*D]; each pass runs
            // attention (or attention_fresh) once per layer. Returns (seconds of each pass, the last
            // layer's output). Each layer has its own pool memory, so a pass over many layers
            // streams the K/V from DRAM as a decode step does.
            Release r{o};
            require(nh > 0 && nkv > 0 && nh % nkv == 0 && D > 0 && D % 16 == 0, "nh % nkv == 0, D % 16 == 0");
            require(p0 >= 0 && M >= 1 && layers >= 1 && repeat >= 1, "p0 >= 0, M, layers, repeat >= 1");
            const int ctx = p0 + M, B = 16, n_pages = (ctx + B - 1) / B, KD = nkv * D;
            const KvDType dt = kv_of(kv);
            std::vector<float> kh(size_t(ctx) * KD), vh(kh.size()), qh(size_t(M) * nh * D);
            std::vector<int32_t> pages(n_pages), slots(ctx), pos(M);
            {
              py::gil_scoped_release nogil;
              std::mt19937 rng(seed);
              std::normal_distribution<float> nd(0.0f, 1.0f);
              for (auto& x : kh) x = nd(rng);
              for (auto& x : vh) x = nd(rng);
              for (auto& x : qh) x = nd(rng);
            }
            KvPool pool(o.be(), layers, nkv, D, B, n_pages, dt);
            for (int i = 0; i < n_pages; ++i) pages[i] = pool.alloc_page();
            for (int t = 0; t < ctx; ++t) slots[t] = pages[t / B] * B + t % B;
            for (int i = 0; i < M; ++i) pos[i] = p0 + i;
            auto put_f = [&](const std::vector<float>& h) {
              float* d = o.scratch(h.size());
              o.be().upload(d, h.data(), sizeof(float) * h.size());
              return d;
            };
            auto put_i = [&](const std::vector<int32_t>& h) {
              int32_t* d = reinterpret_cast<int32_t*>(o.scratch(h.size()));
              o.be().upload(d, h.data(), sizeof(int32_t) * h.size());
              return d;
            };
            float *kd = put_f(kh), *vd = put_f(vh), *qd = put_f(qh), *out = o.scratch(size_t(M) * nh * D);
            int32_t *sd = put_i(slots), *pd = put_i(pages), *posd = put_i(pos);
            std::vector<double> secs(repeat);
            {
              py::gil_scoped_release nogil;
              for (int l = 0; l < layers; ++l) o.be().kv_write(pool, l, kd, vd, KD, sd, ctx);
              o.be().sync();
              for (int rep = 0; rep < repeat; ++rep) {
                const auto t0 = std::chrono::steady_clock::now();
                for (int l = 0; l < layers; ++l) {
                  if (fresh)
                    o.be().attention_fresh(pool, l, qd, nh * D, M, posd, pd, nh, nkv, D, kd + size_t(p0) * KD,
                                           vd + size_t(p0) * KD, KD, out);
                  else
                    o.be().attention(pool, l, qd, nh * D, M, posd, pd, nh, nkv, D, out);
                }
                o.be().sync();
                secs[rep] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
              }
            }
            return py::make_tuple(secs, o.get(out, {M, py::ssize_t(nh) * D}));
          },
          py::arg("nh"), py::arg("nkv"), py::arg("D"), py::arg("p0"), py::arg("M") = 1, py::kw_only(),
          py::arg("kv") = "f16", py::arg("layers") = 1, py::arg("repeat") = 5, py::arg("fresh") = false,
          py::arg("seed") = 0)
      .def("rmsnorm",
           [](BackendOps& o, const Arr<float>& x, const Arr<float>& w, float eps) {
             Release r{o};
             require(x.ndim() == 2 && w.ndim() == 1 && w.shape(0) == x.shape(1), "x [M, n], w [n]");
             const int M = int(x.shape(0)), n = int(x.shape(1));
             float* y = o.scratch(size_t(M) * n);
             o.be().rmsnorm(o.put(x), o.put(w), M, n, eps, y);
             return o.get(y, {M, n});
           })
      .def("rope",
           [](BackendOps& o, const Arr<float>& x, int n_heads, const Arr<int32_t>& pos, const Arr<float>& inv_freq) {
             Release r{o};
             require(x.ndim() == 2 && pos.ndim() == 1 && pos.shape(0) == x.shape(0), "x [M, n_heads*D], pos [M]");
             const int M = int(x.shape(0)), D = int(inv_freq.shape(0)) * 2;
             require(x.shape(1) == py::ssize_t(n_heads) * D, "x must be [M, n_heads * 2*len(inv_freq)]");
             float* xd = o.put(x);
             o.be().rope(xd, M, n_heads, D, n_heads * D, o.put(pos), o.put(inv_freq));
             return o.get(xd, {M, py::ssize_t(n_heads) * D});
           })
      .def("silu_mul",
           [](BackendOps& o, const Arr<float>& a, const Arr<float>& b) {
             Release r{o};
             require(a.ndim() == 2 && a.shape(0) == b.shape(0) && a.shape(1) == b.shape(1), "a, b [M, n]");
             const int M = int(a.shape(0)), n = int(a.shape(1));
             float* y = o.scratch(size_t(M) * n);
             o.be().silu_mul(o.put(a), o.put(b), M, n, y);
             return o.get(y, {M, n});
           })
      .def("add",
           [](BackendOps& o, const Arr<float>& x, const Arr<float>& y) {
             Release r{o};
             require(x.size() == y.size(), "x, y same size");
             float* xd = o.put(x);
             o.be().add(xd, o.put(y), size_t(x.size()));
             return o.get(xd, {x.size()});
           })
      .def("add_bias",
           [](BackendOps& o, const Arr<float>& x, const Arr<float>& b) {
             Release r{o};
             require(x.ndim() == 2 && b.ndim() == 1 && b.shape(0) == x.shape(1), "x [M, n], b [n]");
             const int M = int(x.shape(0)), n = int(x.shape(1));
             float* xd = o.put(x);
             o.be().add_bias(xd, o.put(b), M, n, n);
             return o.get(xd, {M, n});
           })
      .def("embed",
           [](BackendOps& o, const Arr<float>& table, const Arr<int32_t>& ids) {
             Release r{o};
             require(table.ndim() == 2, "table [V, H]");
             const int V = int(table.shape(0)), H = int(table.shape(1)), M = int(ids.size());
             for (int i = 0; i < M; ++i) require(ids.data()[i] >= 0 && ids.data()[i] < V, "id outside the table");
             WeightView w;
             w.dtype = DType::F32, w.N = V, w.K = H, w.Kp = H, w.data = o.put(table);
             float* x = o.scratch(size_t(M) * H);
             o.be().embed(w, o.put(ids), M, x);
             return o.get(x, {M, H});
           })
      .def("embed_w8a8",  // an 8-bit table: int8 codes [V, Kp], f16 scales (as u16) [V, Kp/32]
           [](BackendOps& o, const Arr<int8_t>& codes, const Arr<uint16_t>& scales, const Arr<int32_t>& ids, int H) {
             Release r{o};
             require(codes.ndim() == 2 && scales.ndim() == 2 && codes.shape(0) == scales.shape(0), "codes [V, Kp], scales [V, Kp/32]");
             const int V = int(codes.shape(0)), Kp = int(codes.shape(1)), M = int(ids.size());
             require(H > 0 && Kp == round_up(H, kQ8Block) && scales.shape(1) == Kp / kQ8Block, "Kp = H rounded up to 32");
             for (int i = 0; i < M; ++i) require(ids.data()[i] >= 0 && ids.data()[i] < V, "id outside the table");
             WeightView w;
             w.dtype = DType::W8A8, w.N = V, w.K = H, w.Kp = Kp, w.group = kQ8Block;
             w.data = o.put(codes), w.scales = o.put(scales);
             float* x = o.scratch(size_t(M) * H);
             o.be().embed(w, o.put(ids), M, x);
             return o.get(x, {M, H});
           })
      .def(
          "matmul",
          [](BackendOps& o, const Arr<float>& w, const Arr<float>& x, bool quantised_input) {
            // f32 weights [N, K]; quantised_input runs quantize_input first (the integer paths'
            // activation step, exercised here on the f32 GEMM as well).
            Release r{o};
            require(w.ndim() == 2 && x.ndim() == 2 && w.shape(1) == x.shape(1), "w [N, K], x [M, K]");
            const int N = int(w.shape(0)), K = int(w.shape(1)), M = int(x.shape(0));
            WeightView wv;
            wv.dtype = DType::F32, wv.N = N, wv.K = K, wv.Kp = K, wv.data = o.put(w);
            o.be().prepare_weight(wv);
            float* xd = o.put(x);
            QuantScratch q;
            if (quantised_input) {
              const int Kp = round_up(K, kQ8Block);
              q.act.q = reinterpret_cast<int8_t*>(o.scratch(size_t(M) * Kp / 4 + 1));
              q.act.d = o.scratch(size_t(M) * Kp / kQ8Block);
              q.act.s = reinterpret_cast<int32_t*>(o.scratch(size_t(M) * Kp / kQ8Block));
              o.be().quantize_input(xd, M, K, q);
            }
            float* y = o.scratch(size_t(M) * N);
            o.be().matmul(wv, xd, q, M, y, N);
            return o.get(y, {M, N});
          },
          py::arg("w"), py::arg("x"), py::arg("quantised_input") = false)
      .def(
          "attention",
          // q f32 [M, nh*D] at positions p0..p0+M-1; k, v f32 [ctx, nkv, D] with ctx = p0+M,
          // written into a pool of `kv` pages (block 16) with kv_write, then attention.
          [](BackendOps& o, const Arr<float>& q, const Arr<float>& k, const Arr<float>& v, int p0,
             const std::string& kv) { return attention_op(o, q, k, v, p0, kv, false); },
          py::arg("q"), py::arg("k"), py::arg("v"), py::arg("p0"), py::arg("kv") = "f32")
      .def(
          "matmul_q",
          [](BackendOps& o, const std::string& dtype, const py::array& data, const py::array& scales, int K,
             float tscale, const Arr<float>& x, std::optional<py::array> mins) {
            // A weight in a formats.h layout (codes and scales as the quantisers write them, f16
            // as uint16), through quantize_input + matmul: y f32 [M, N].
            Release r{o};
            WeightView w;
            w.dtype = dtype == "nvfp4" ? DType::NVFP4 : dtype == "w4a8" ? DType::W4A8 : dtype == "w8a8" ? DType::W8A8
                    : dtype == "f16" ? DType::F16 : DType::F32;
            require(data.ndim() == 2 && x.ndim() == 2 && int(x.shape(1)) == K, "data [N, *], x [M, K]");
            w.N = int(data.shape(0)), w.K = K;
            w.Kp = w.dtype == DType::NVFP4 || w.dtype == DType::W4A8 ? int(data.shape(1)) * 2
                 : w.dtype == DType::W8A8                            ? int(data.shape(1))
                                                                     : K;
            require(!is_integer(w.dtype) || w.Kp == round_up(K, kQuantPad), "codes must cover round_up(K, 32)");
            w.group = w.dtype == DType::NVFP4 ? kNvfp4Block
                    : w.dtype == DType::W4A8  ? w.Kp / int(scales.shape(scales.ndim() - 1))
                                              : kQ8Block;
            w.tscale = tscale;
            w.data = o.put_raw(data);
            if (is_integer(w.dtype)) w.scales = o.put_raw(scales);
            if (mins) w.mins = o.put_raw(*mins);
            o.be().prepare_weight(w);
            const int M = int(x.shape(0));
            float* xd = o.put(x);
            QuantScratch q;
            if (is_integer(w.dtype)) {
              q.act.q = reinterpret_cast<int8_t*>(o.scratch(size_t(M) * w.Kp / 4 + 1));
              q.act.d = o.scratch(size_t(M) * w.Kp / kQ8Block);
              q.act.s = reinterpret_cast<int32_t*>(o.scratch(size_t(M) * w.Kp / kQ8Block));
              o.be().quantize_input(xd, M, K, q);
            }
            float* y = o.scratch(size_t(M) * w.N);
            o.be().matmul(w, xd, q, M, y, w.N);
            return o.get(y, {M, w.N});
          },
          py::arg("dtype"), py::arg("data"), py::arg("scales"), py::arg("K"), py::arg("tscale") = 1.0f,
          py::arg("x"), py::arg("mins") = py::none())
      .def(
          "kv_write_bytes",
          [](BackendOps& o, const Arr<float>& k, const Arr<float>& v, const std::string& kv) {
            // k, v f32 [ctx, nkv, D] written by kv_write into a fresh one-layer pool (pages in
            // order, block 16): the pool's K and V bytes, for a byte comparison across backends.
            Release r{o};
            require(k.ndim() == 3 && v.ndim() == 3 && k.size() == v.size(), "k, v [ctx, nkv, D]");
            const int ctx = int(k.shape(0)), nkv = int(k.shape(1)), D = int(k.shape(2)), B = 16;
            const int n_pages = (ctx + B - 1) / B;
            const KvDType dt = kv_of(kv);
            KvPool pool(o.be(), 1, nkv, D, B, n_pages, dt);
            std::vector<int32_t> slots(ctx);
            for (int i = 0; i < n_pages; ++i) pool.alloc_page();
            for (int t = 0; t < ctx; ++t) slots[t] = t;  // pages 0.. in order
            int32_t* sd = o.put(Arr<int32_t>(py::array_t<int32_t>(py::ssize_t(ctx), slots.data())));
            o.be().kv_write(pool, 0, o.put(k), o.put(v), nkv * D, sd, ctx);
            const size_t bytes = size_t(ctx) * pool.token_bytes(), vbytes = size_t(ctx) * nkv * pool.v_row_bytes();
            py::array_t<uint8_t> kb{py::ssize_t(bytes)}, vb{py::ssize_t(vbytes)};
            o.be().sync();
            o.be().download(kb.mutable_data(), pool.k(0), bytes);
            o.be().download(vb.mutable_data(), pool.v(0), vbytes);
            return py::make_tuple(kb, vb);
          },
          py::arg("k"), py::arg("v"), py::arg("kv"))
      .def(
          "sample",
          [](BackendOps& o, const Arr<float>& x, float temperature, int top_k, float top_p, double u,
             py::object mask) {
            // Backend::sample over x [V] with the draw u; mask: bool [V] (False: not allowed) or None.
            Release r{o};
            require(x.ndim() == 1 && x.size() >= 1, "x [V]");
            const int V = int(x.size());
            const uint32_t* md = nullptr;
            if (!mask.is_none()) {
              auto m = Arr<bool>::ensure(mask);
              require(m && m.ndim() == 1 && m.shape(0) == V, "mask must be bool [V]");
              std::vector<int32_t> bits((size_t(V) + 31) / 32, 0);
              for (int i = 0; i < V; ++i)
                if (m.data()[i]) bits[i / 32] |= int32_t(1u << (i % 32));
              md = reinterpret_cast<const uint32_t*>(o.put(Arr<int32_t>(py::array_t<int32_t>(py::ssize_t(bits.size()), bits.data()))));
            }
            int32_t* out = reinterpret_cast<int32_t*>(o.scratch(1));
            o.be().sample(o.put(x), V, SamplingParams{temperature, top_k, top_p}, u, md, out);
            int32_t h = 0;
            o.be().sync();
            o.be().download(&h, out, sizeof(h));
            return h;
          },
          py::arg("x"), py::arg("temperature") = 0.0f, py::arg("top_k") = 0, py::arg("top_p") = 1.0f,
          py::arg("u") = 0.0, py::arg("mask") = py::none())
      .def("argmax", [](BackendOps& o, const Arr<float>& x) {
        Release r{o};
        require(x.size() >= 1, "x must not be empty");
        int32_t* out = reinterpret_cast<int32_t*>(o.scratch(1));
        o.be().argmax(o.put(x), int(x.size()), out);
        int32_t h = 0;
        o.be().sync();
        o.be().download(&h, out, sizeof(h));
        return h;
      });
  m.def("backends", &usable_backends, "Backends this build has that can run here (a GPU for cuda).");
  m.def("built_backends", &built_backends, "Backends this build has.");
}
