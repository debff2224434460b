// FlashMLA's sm90 dense decode as a benchmark peer of MLA verify: a C entry point over its kernels
// (the decoding scheduler, the split-KV kernel, the combine), so that bench/mla_verify/peers.py
// can call it through ctypes with no PyTorch extension build. Built by build.sh from a FlashMLA
// checkout the caller names (never fetched or kept here); the layout is the project's: q
// [b, s_q, h_q, 576], one KV head, pages of 64 rows of 576, out [b, s_q, h_q, 512].
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>

#include "params.h"
#include "sm90/decode/dense/splitkv_mla.h"
#include "smxx/decode/combine/combine.h"
#include "smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.h"

namespace {

constexpr int kDimQk = 576;
constexpr int kDimV = 512;
constexpr int kPage = 64;
constexpr int kBlockN = 64;          // keys per scheduling block
constexpr int kFixedOverhead = 5;    // blocks a split costs beyond its keys, as FlashMLA plans

int CeilDiv(int a, int b) { return (a + b - 1) / b; }

}  // namespace

extern "C" {

// Words (int32) of one scheduler entry, and how many entries (SM parts) a shape uses.
int flashmla_peer_sched_words() { return static_cast<int>(sizeof(DecodingSchedMeta) / 4); }

int flashmla_peer_sm_parts(int num_sms, int s_q, int h_q) {
  const int parts = num_sms / CeilDiv(s_q * h_q, 64);
  return parts > 1 ? parts : 1;
}

// Plans the splits for `seqlens` [b] into `sched` [parts, words] and `num_splits` [b + 1].
int flashmla_peer_plan(int b, int s_q, int* seqlens, void* sched, int* num_splits, int parts,
                       cudaStream_t stream) {
  try {
    GetDecodeSchedMetaParams p{};
    p.b = b;
    p.s_q = s_q;
    p.block_size_n = kBlockN;
    p.fixed_overhead_num_blocks = kFixedOverhead;
    p.topk = -1;
    p.extra_topk = -1;
    p.topk_length = nullptr;
    p.extra_topk_length = nullptr;
    p.seqlens_k_ptr = seqlens;
    p.tile_scheduler_metadata_ptr = static_cast<DecodingSchedMeta*>(sched);
    p.num_splits_ptr = num_splits;
    p.num_sm_parts = parts;
    p.stream = stream;
    smxx::decode::run_get_decoding_sched_meta_kernel(p);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flashmla_peer_plan: %s\n", e.what());
    return -1;
  }
  return static_cast<int>(cudaGetLastError());
}

// One decode: the split-KV kernel into `lse_accum` [b + parts, s_q * h_q] and `o_accum`
// [b + parts, s_q * h_q, 512] (float), then the combine into `out` and `lse` [b, s_q * h_q].
int flashmla_peer_decode(int b, int s_q, int h_q, float scale, void* q, void* kv, int num_pages,
                         int* table, int64_t table_stride, int* seqlens, void* sched,
                         int* num_splits, int parts, void* out, float* lse, float* lse_accum,
                         float* o_accum, cudaStream_t stream) {
  const int rows = s_q * h_q;  // queries per request, with one KV head
  try {
    DenseAttnDecodeParams p{};
    p.b = b;
    p.s_q = s_q;
    p.q_seq_per_hk = rows;
    p.d = kDimQk;
    p.d_v = kDimV;
    p.h_q = h_q;
    p.h_k = 1;
    p.num_blocks = num_pages;
    p.q_head_per_hk = h_q;
    p.is_causal = s_q > 1;
    p.scale_softmax = scale;
    p.scale_softmax_log2 = static_cast<float>(scale * M_LOG2E);
    p.q_ptr = q;
    p.k_ptr = kv;
    p.o_ptr = out;
    p.softmax_lse_ptr = lse;
    p.q_batch_stride = int64_t{rows} * kDimQk;
    p.k_batch_stride = int64_t{kPage} * kDimQk;
    p.o_batch_stride = int64_t{rows} * kDimV;
    p.q_row_stride = kDimQk;
    p.k_row_stride = kDimQk;
    p.o_row_stride = kDimV;
    p.q_head_stride = kDimQk;
    p.k_head_stride = kDimQk;
    p.o_head_stride = int64_t{rows} * kDimV;
    p.block_table = table;
    p.block_table_batch_stride = table_stride;
    p.page_block_size = kPage;
    p.seqlens_k_ptr = seqlens;
    p.tile_scheduler_metadata_ptr = static_cast<DecodingSchedMeta*>(sched);
    p.num_sm_parts = parts;
    p.num_splits_ptr = num_splits;
    p.total_num_splits = b + parts;
    p.softmax_lseaccum_ptr = lse_accum;
    p.oaccum_ptr = o_accum;
    p.stream = stream;
    sm90::run_flash_splitkv_mla_kernel<cutlass::bfloat16_t>(p);

    CombineParams c{};
    c.b = b;
    c.s_q = s_q;
    c.h_q = h_q;
    c.d_v = kDimV;
    c.lse = lse;
    c.out = out;
    c.stride_lse_b = rows;
    c.stride_lse_s_q = h_q;
    c.stride_o_b = rows * kDimV;
    c.stride_o_s_q = h_q * kDimV;
    c.stride_o_h_q = kDimV;
    c.lse_accum = lse_accum;
    c.o_accum = o_accum;
    c.stride_lse_accum_split = rows;
    c.stride_lse_accum_s_q = h_q;
    c.stride_o_accum_split = rows * kDimV;
    c.stride_o_accum_s_q = h_q * kDimV;
    c.stride_o_accum_h_q = kDimV;
    c.tile_scheduler_metadata_ptr = static_cast<DecodingSchedMeta*>(sched);
    c.num_splits_ptr = num_splits;
    c.num_sm_parts = parts;
    c.attn_sink = nullptr;
    c.stream = stream;
    smxx::decode::run_flash_mla_combine_kernel<cutlass::bfloat16_t>(c);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flashmla_peer_decode: %s\n", e.what());
    return -1;
  }
  return static_cast<int>(cudaGetLastError());
}

}  // extern "C"
