// attention_prefill.cu — causal attention of M new queries over paged KV of every pool format
// but kpc4 (the cached prefix and the chunk's own tokens) on the tensor cores: flash-attention
// style, mma.sync m16n8k16 f16 in / f32 accumulate, online softmax in the log2 domain.
// Contract: kernels_cuda.h (attention_prefill). sm_80+ (ldmatrix, mma.sync): Orin and Hopper.
//
// Grid (row tiles of 64, KV heads). Rows are (query m, head j of the KV head's group of G)
// pairs, r = m G + j, so a block's 64 rows share one KV head and every K / V tile read once
// serves 64 / G queries x G heads. 4 warps, 16 rows each. Per KV tile of 64 tokens:
//   fill   all 128 threads copy (f16) or decode (NVFP4: e2m1 x e4m3, exact in f16; NVFP4R,
//          K8V4: times the row scale, f32 rows: rounded to f16) the tile's K and V rows into
//          shared memory as f16 [64][D + 8] (padded: conflict-free ldmatrix); the chunk's own
//          tokens (fresh: t >= pos[0]) come from their f32 rows, rounded to f16;
//   S      = Q K^T per warp (16 x 64), B fragments by ldmatrix; Q in registers as f16, split
//          into hi + lo (QSPLIT: f32-level scores, two MMAs per slice);
//   softmax rows gid / gid + 8 of the warp tile; causal mask t <= pos[m];
//   O     += P V, P from the S accumulators (no shuffle), V fragments by ldmatrix.trans;
//          P rounded to f16 (relative 2^-11), O in f32.
// Warps whose rows all end before a tile skip its MMAs (the diagonal of the causal mask).
#include <cstdint>

#include "attention_mma_rows.cuh"
#include "common.cuh"
#include "kernels_cuda.h"

namespace kvdeck::cuda {

using namespace detail;

namespace {

// =====================================================================================
// ldmatrix, half2 helpers (the m16n8k16 f16 mma: common.cuh mma16816)
// =====================================================================================

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
#ifdef KVDECK_CUDA_EMU
  emu::ldsm_x4(r, p, false);
#else
  const uint32_t a = uint32_t(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
#endif
}

__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* p) {
#ifdef KVDECK_CUDA_EMU
  emu::ldsm_x4(r, p, true);
#else
  const uint32_t a = uint32_t(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
#endif
}

__device__ __forceinline__ uint32_t pack_h2(float a, float b) {
  const __half2 h = __floats2half2_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// An E4M3 byte as f16 (exact), NaN (0x7F / 0xFF) as 0 like formats.cpp's decoder.
__device__ __forceinline__ __half e4m3_half(uint32_t b) {
  if ((b & 0x7Fu) == 0x7Fu) return __ushort_as_half(0);
  const uint16_t h = uint16_t(((b & 0x7Fu) << 7) | ((b & 0x80u) << 8));
  return __hmul(__ushort_as_half(h), __float2half(256.0f));
}

// =====================================================================================
// Tile fill: 16 values of one K or V row into shared memory as f16
// =====================================================================================

constexpr int kRows = 64;  // query rows per block (4 warps x 16)
constexpr int kTok = 64;   // tokens per KV tile

// Bytes of a K (V = false) or V row of one head (kv_pool.h; attention_mma_rows.cuh Fmt).
template <KvFormat F, int D, bool V>
__host__ __device__ constexpr size_t row_bytes() {
  if constexpr (F == KvFormat::F32) return size_t(D) * 4;
  else if constexpr (V) return Fmt<F>::template vrow<D>();
  else return Fmt<F>::template krow<D>();
}

__device__ __forceinline__ void scale_h2(uint32_t (&h)[8], float g) {  // h *= g, in f32, rounded to f16
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float2 f = __half22float2(bits2h(h[i]));
    h[i] = pack_h2(f.x * g, f.y * g);
  }
}

// Values 16c .. 16c + 15 of a row as f16: f16 as they are; NVFP4 e2m1 x e4m3 (exact in f16);
// NVFP4R (and K8V4's V) the same times the f16 row scale, K8V4's K int8 times its row scale,
// f32 rows: those two products and f32 values rounded to f16 (as the fresh rows).
template <KvFormat F, int D, bool V>
__device__ __forceinline__ void fill16(__half* dst, const uint8_t* row, int c) {
  uint32_t h[8];
  if constexpr (F == KvFormat::F16) {
    const uint4* p = reinterpret_cast<const uint4*>(row + size_t(c) * 32);
    const uint4 lo = __ldg(p), hi = __ldg(p + 1);
    h[0] = lo.x, h[1] = lo.y, h[2] = lo.z, h[3] = lo.w, h[4] = hi.x, h[5] = hi.y, h[6] = hi.z, h[7] = hi.w;
  } else if constexpr (F == KvFormat::F32) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(row) + 4 * c + i);
      h[2 * i] = pack_h2(v.x, v.y), h[2 * i + 1] = pack_h2(v.z, v.w);
    }
  } else if constexpr (F == KvFormat::K8V4 && !V) {  // int8 [D] + f16 row scale: 2-byte aligned rows
    uint32_t w[4];
    load_words<2>(row + size_t(c) * 16, w, 4);
#pragma unroll
    for (int i = 0; i < 4; ++i) i8x4_to_half2x2(w[i], h + 2 * i);
    scale_h2(h, __half2float(__ushort_as_half(uint16_t(ld_u16(row + D)))));
  } else {  // codes [D/2], E4M3 block scales [D/16] (+ the f16 row scale)
    uint32_t w[2];
    load_words<Fmt<F>::template align<D>()>(row + size_t(c) * 8, w, 2);  // 8 (D 128), 4 (D 64) or 2
    const __half s = e4m3_half(__ldg(row + D / 2 + c));
    const __half2 s2 = __halves2half2(s, s);
    e2m1x8_to_half2x4(w[0], h);
    e2m1x8_to_half2x4(w[1], h + 4);
#pragma unroll
    for (int i = 0; i < 8; ++i) h[i] = h2bits(__hmul2(bits2h(h[i]), s2));
    if constexpr (Fmt<F>::kRowScale) scale_h2(h, __half2float(__ushort_as_half(uint16_t(ld_u16(row + D / 2 + D / 16)))));
  }
  reinterpret_cast<uint4*>(dst)[0] = make_uint4(h[0], h[1], h[2], h[3]);
  reinterpret_cast<uint4*>(dst)[1] = make_uint4(h[4], h[5], h[6], h[7]);
}

__device__ __forceinline__ void fill16_f32(__half* dst, const float* x) {
  uint32_t h[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(x) + i);
    h[2 * i] = pack_h2(v.x, v.y), h[2 * i + 1] = pack_h2(v.z, v.w);
  }
  reinterpret_cast<uint4*>(dst)[0] = make_uint4(h[0], h[1], h[2], h[3]);
  reinterpret_cast<uint4*>(dst)[1] = make_uint4(h[4], h[5], h[6], h[7]);
}

// =====================================================================================
// Kernel
// =====================================================================================

template <KvFormat F, int D, bool QSPLIT>
__global__ void __launch_bounds__(128, 2)
attn_prefill_kernel(const uint8_t* __restrict__ kb, const uint8_t* __restrict__ vb, const int32_t* __restrict__ pages,
                    int block, int n_kv, const float* __restrict__ q, int ldq, int M, int G,
                    const int32_t* __restrict__ pos, float sl2, float* __restrict__ out, int ldo,
                    const float* __restrict__ fk, const float* __restrict__ fv, int fld) {
  constexpr int KS = D / 16;   // k slices of S, k16 tiles of D
  constexpr int ND = D / 8;    // n tiles of O
  constexpr int LD = D + 8;    // shared row stride in halves
  constexpr size_t kRowK = row_bytes<F, D, false>(), kRowV = row_bytes<F, D, true>();
  __shared__ __align__(16) __half ks[kTok][LD];
  __shared__ __align__(16) __half vs[kTok][LD];
  __shared__ int s_end;

  const int g = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int gid = lane >> 2, tig = lane & 3;
  const int rows = M * G, r_base = blockIdx.x * kRows + warp * 16;
  pdl_wait();
  if (tid == 0) s_end = 0;
  __syncthreads();

  // ---- this lane's two rows: limits (last visible token) and Q fragments -----------------
  int lim[2];
  const float* qr[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = r_base + gid + 8 * i;
    const bool ok = r < rows;
    const int m = ok ? r / G : 0;
    lim[i] = ok ? __ldg(pos + m) : -1;
    qr[i] = ok ? q + size_t(m) * ldq + size_t(g * G + r % G) * D : nullptr;
  }
  int wlim = max(lim[0], lim[1]);
#pragma unroll
  for (int o = 16; o; o >>= 1) wlim = max(wlim, __shfl_xor_sync(0xffffffffu, wlim, o));
  if (lane == 0) atomicMax(&s_end, wlim + 1);

  uint32_t qh[KS][4], ql[QSPLIT ? KS : 1][4];
#pragma unroll
  for (int j = 0; j < KS; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {  // a0: (row gid, d 2t), a1: (gid + 8, 2t), a2: (gid, 2t + 8), a3: (gid + 8, 2t + 8)
      const float* p = qr[e & 1];
      float2 v = make_float2(0.f, 0.f);
      if (p) v = *reinterpret_cast<const float2*>(p + 16 * j + 2 * tig + 8 * (e >> 1));
      v.x *= sl2, v.y *= sl2;
      const __half2 h = __floats2half2_rn(v.x, v.y);
      qh[j][e] = *reinterpret_cast<const uint32_t*>(&h);
      if constexpr (QSPLIT) {
        const float2 hf = __half22float2(h);
        ql[j][e] = pack_h2(v.x - hf.x, v.y - hf.y);
      }
    }
  __syncthreads();
  const int kv_end = s_end;
  const int f0 = fk ? __ldg(pos) : 0x7FFFFFFF;  // first token read from the fresh rows

  float o[ND][4] = {};
  float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};

  for (int t0 = 0; t0 < kv_end; t0 += kTok) {
    // ---- fill the K / V tile ----------------------------------------------------------------
    __syncthreads();  // the previous tile is consumed
    for (int it = tid; it < kTok * KS; it += 128) {
      const int tk = it / KS, c = it % KS, t = t0 + tk;
      __half* kd = &ks[tk][16 * c];
      __half* vd = &vs[tk][16 * c];
      if (t >= kv_end) {
        const uint4 z = make_uint4(0, 0, 0, 0);
        reinterpret_cast<uint4*>(kd)[0] = z, reinterpret_cast<uint4*>(kd)[1] = z;
        reinterpret_cast<uint4*>(vd)[0] = z, reinterpret_cast<uint4*>(vd)[1] = z;
      } else if (t >= f0) {
        const size_t off = size_t(t - f0) * fld + size_t(g) * D + 16 * c;
        fill16_f32(kd, fk + off);
        fill16_f32(vd, fv + off);
      } else {
        const size_t slot = (size_t(__ldg(pages + t / block)) * block + t % block) * n_kv + g;
        fill16<F, D, false>(kd, kb + slot * kRowK, c);
        fill16<F, D, true>(vd, vb + slot * kRowV, c);
      }
    }
    __syncthreads();
    if (t0 > wlim) continue;  // every row of this warp ends before the tile

    // ---- S = Q K^T (16 rows x 64 tokens) --------------------------------------------------------
    float s[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = 0.f;
#pragma unroll
      for (int j = 0; j < KS; j += 2) {  // matrices: slice j (d 0-7, 8-15), slice j + 1
        uint32_t b[4];
        ldsm_x4(b, &ks[8 * nt + (lane & 7)][16 * j + 8 * (lane >> 3)]);
        mma16816(s[nt], qh[j][0], qh[j][1], qh[j][2], qh[j][3], b[0], b[1]);
        mma16816(s[nt], qh[j + 1][0], qh[j + 1][1], qh[j + 1][2], qh[j + 1][3], b[2], b[3]);
        if constexpr (QSPLIT) {
          mma16816(s[nt], ql[j][0], ql[j][1], ql[j][2], ql[j][3], b[0], b[1]);
          mma16816(s[nt], ql[j + 1][0], ql[j + 1][1], ql[j + 1][2], ql[j + 1][3], b[2], b[3]);
        }
      }
    }
    // ---- online softmax of rows gid (e = 0, 1) and gid + 8 (e = 2, 3) ---------------------------
    float mx[2] = {mrow[0], mrow[1]};
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int t = t0 + 8 * nt + 2 * tig + (e & 1);
        if (t > lim[e >> 1]) s[nt][e] = -INFINITY;
        mx[e >> 1] = fmaxf(mx[e >> 1], s[nt][e]);
      }
    float alpha[2], ref[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      ref[i] = mx[i] == -INFINITY ? 0.f : mx[i];
      alpha[i] = exp2f(mrow[i] - ref[i]);
      mrow[i] = mx[i];
      lrow[i] *= alpha[i];
    }
    uint32_t pa[8][2];  // P as half2: [n tile][row gid / gid + 8], tokens 2t, 2t + 1
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      const float p0 = exp2f(s[nt][0] - ref[0]), p1 = exp2f(s[nt][1] - ref[0]);
      const float p2 = exp2f(s[nt][2] - ref[1]), p3 = exp2f(s[nt][3] - ref[1]);
      lrow[0] += p0 + p1, lrow[1] += p2 + p3;
      pa[nt][0] = pack_h2(p0, p1), pa[nt][1] = pack_h2(p2, p3);
    }
#pragma unroll
    for (int nd = 0; nd < ND; ++nd) o[nd][0] *= alpha[0], o[nd][1] *= alpha[0], o[nd][2] *= alpha[1], o[nd][3] *= alpha[1];
    // ---- O += P V ---------------------------------------------------------------------------------
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)  // tokens 16 kk .. 16 kk + 15 = n tiles 2 kk, 2 kk + 1 of S
#pragma unroll
      for (int nd = 0; nd < ND; nd += 2) {
        uint32_t b[4];  // matrices: (tokens +0-7, d nd), (+8-15, nd), (+0-7, nd + 1), (+8-15, nd + 1)
        ldsm_x4_t(b, &vs[16 * kk + (lane & 7) + 8 * ((lane >> 3) & 1)][8 * nd + 8 * (lane >> 4)]);
        mma16816(o[nd], pa[2 * kk][0], pa[2 * kk][1], pa[2 * kk + 1][0], pa[2 * kk + 1][1], b[0], b[1]);
        mma16816(o[nd + 1], pa[2 * kk][0], pa[2 * kk][1], pa[2 * kk + 1][0], pa[2 * kk + 1][1], b[2], b[3]);
      }
  }
  pdl_launch_dependents();

  // ---- out = O / l -------------------------------------------------------------------------------
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    lrow[i] += __shfl_xor_sync(0xffffffffu, lrow[i], 1);
    lrow[i] += __shfl_xor_sync(0xffffffffu, lrow[i], 2);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = r_base + gid + 8 * i;
    if (r >= rows) continue;
    const float inv = 1.0f / lrow[i];
    float* dst = out + size_t(r / G) * ldo + size_t(g * G + r % G) * D + 2 * tig;
#pragma unroll
    for (int nd = 0; nd < ND; ++nd)
      *reinterpret_cast<float2*>(dst + 8 * nd) = make_float2(o[nd][2 * i] * inv, o[nd][2 * i + 1] * inv);
  }
}

template <KvFormat F, int D, bool QSPLIT>
cudaError_t launch_prefill(const PagedKv& kv, const float* q, int ldq, int M, int G, const int32_t* pos, float sl2,
                           float* out, cudaStream_t st, const float* fk, const float* fv, int fld) {
  const dim3 grid(unsigned((M * G + kRows - 1) / kRows), unsigned(kv.n_kv));
  return launch_kernel(attn_prefill_kernel<F, D, QSPLIT>, grid, dim3(128), st, /*pdl=*/true,
                       static_cast<const uint8_t*>(kv.k), static_cast<const uint8_t*>(kv.v), kv.pages, kv.block,
                       kv.n_kv, q, ldq, M, G, pos, sl2, out, kv.n_kv * G * D, fk, fv, fld);
}

template <KvFormat F, int D>
cudaError_t launch_prefill_q(bool qsplit, const PagedKv& kv, const float* q, int ldq, int M, int G,
                             const int32_t* pos, float sl2, float* out, cudaStream_t st, const float* fk,
                             const float* fv, int fld) {
  return qsplit ? launch_prefill<F, D, true>(kv, q, ldq, M, G, pos, sl2, out, st, fk, fv, fld)
                : launch_prefill<F, D, false>(kv, q, ldq, M, G, pos, sl2, out, st, fk, fv, fld);
}

bool aligned(const void* p, size_t a) { return (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0; }

}  // namespace

// =====================================================================================
// Launcher
// =====================================================================================

cudaError_t attention_prefill(const PagedKv& kv, const float* q, int ldq, int M, int n_heads, const int32_t* pos,
                              float scale, float* out, cudaStream_t stream, const float* fresh_k,
                              const float* fresh_v, int fresh_ld, bool q_split) {
  if (M < 1 || kv.n_kv < 1 || n_heads % kv.n_kv != 0 || kv.block < 1 || (fresh_k == nullptr) != (fresh_v == nullptr))
    return cudaErrorInvalidValue;
  const int G = n_heads / kv.n_kv, D = kv.D;
  // what the kernel's vector loads need; anything else is attention_paged's
  const bool ok = (D == 64 || D == 128) && int(kv.format) >= 0 && int(kv.format) <= int(KvFormat::K8V4) &&
                  ldq % 2 == 0 && aligned(q, 8) && aligned(kv.k, 16) && aligned(kv.v, 16) &&
                  (!fresh_k || (fresh_ld % 4 == 0 && fresh_ld >= kv.n_kv * D && aligned(fresh_k, 16) &&
                                aligned(fresh_v, 16))) &&
                  size_t(M) * G <= size_t(1) << 30;
  if (!ok) return cudaErrorNotSupported;
  const float sl2 = scale * 1.4426950408889634f;
#define KVDECK_PREFILL_FMT(FF)                                                                                  \
  case FF:                                                                                                      \
    return D == 128 ? launch_prefill_q<FF, 128>(q_split, kv, q, ldq, M, G, pos, sl2, out, stream, fresh_k, fresh_v, fresh_ld) \
                    : launch_prefill_q<FF, 64>(q_split, kv, q, ldq, M, G, pos, sl2, out, stream, fresh_k, fresh_v, fresh_ld);
  switch (kv.format) {
    KVDECK_PREFILL_FMT(KvFormat::F32)
    KVDECK_PREFILL_FMT(KvFormat::F16)
    KVDECK_PREFILL_FMT(KvFormat::NVFP4)
    KVDECK_PREFILL_FMT(KvFormat::NVFP4R)
    KVDECK_PREFILL_FMT(KvFormat::K8V4)
  }
#undef KVDECK_PREFILL_FMT
  return cudaErrorNotSupported;
}

}  // namespace kvdeck::cuda
