// backend_cpu_pce.h — the CPU backend's KPC4 KV path (kv_pool.h, kvdeck/kv_pce.h): the KV write
// (staging, the K page encoded once the page is full) and attention (decode and prefill).
//
// A query at position p reads its own page (p / 16) from the page's f32 staging slot and every
// earlier page from the pool (K decoded from the per-page codes, V from NVFP4 rows), in decode
// and prefill alike: a prefill's logits equal decode steps', and a cached prefix (whole pages,
// full, rounded) reads the same values as a cold prefill. The arithmetic is the f32 attention's
// (ops_cpu.h: attention_segment_heads for decode, attention_queries for prefill) over f32 rows
// decoded a segment (decode) or a layer's context (prefill) at a time.
#pragma once
#include <cstdint>
#include <vector>

#include "kvdeck/kv_pool.h"
#include "kvdeck/thread_pool.h"

namespace kvdeck::cpu_pce {

struct State {  // reused buffers (grow to the largest context, never shrink)
  explicit State(int threads) : thread_bufs(threads) {}
  std::vector<std::vector<float>> thread_bufs;  // per pool thread
  std::vector<float> ws;                        // prefill: the layer's decoded context
  std::vector<int32_t> tables;                  // prefill: one page table per query page
  std::vector<float> part;                      // decode: per (KV head, segment) partials
  std::vector<int32_t> touched;                 // kv_write: the pages of this call
};

void kv_write(const KvPool& pool, int layer, const float* k, const float* v, int ld, const int32_t* slots, int M,
              State& st);
void attention(ThreadPool& tp, State& st, const KvPool& pool, int layer, const float* q, int ldq, int M,
               const int32_t* pos, const int32_t* pages, int nh, int nkv, int D, float* out);

}  // namespace kvdeck::cpu_pce
