// CPU float64 reference of MLA verify attention (a test oracle, not a production path), and the
// element-wise comparison the tests use against it. Plain C++: no CUDA.
//
// Inputs are bf16 bit patterns (uint16_t) in the layout of MlaVerifyParams (strides in
// elements); outputs are dense float64. The reference walks each request page by page through
// the block table with an online (running-max) softmax in float64, the same order of work as
// the kernels, so that the CPU tests can check it against a direct two-pass formula.
#pragma once

#include <cstdint>
#include <vector>

namespace probesidecar::kernels {

struct MlaVerifyRefInputs {
  int32_t batch = 0, s_q = 0, h_q = 0;
  double softmax_scale = 0.0;
  const uint16_t* q = nullptr;  // [b, s_q, h_q, 576] bf16 bits
  int64_t q_batch_stride = 0, q_token_stride = 0, q_head_stride = 0;
  const uint16_t* kv_cache = nullptr;  // [num_pages, 64, 576] bf16 bits
  int64_t kv_page_stride = 0, kv_row_stride = 0;
  const int32_t* block_table = nullptr;  // [b, max_pages]
  int64_t block_table_batch_stride = 0;
  const int32_t* cache_seqlens = nullptr;  // [b]
};

struct MlaVerifyRefOutputs {
  std::vector<double> out;           // [b, s_q, h_q, 512]
  std::vector<double> abs_weighted;  // [b, s_q, h_q, 512]: sum_k p_k |v_k| (the error scale)
  std::vector<double> lse;           // [b, h_q, s_q], natural log; -inf where no key is seen
};

// Computes requests [first_request, last_request) into `outputs` (sized for the whole batch by
// the caller or, when empty, here), so that callers can spread requests over threads.
void MlaVerifyReference(const MlaVerifyRefInputs& in, MlaVerifyRefOutputs* outputs,
                        int32_t first_request = 0, int32_t last_request = -1);
void ResizeMlaVerifyRefOutputs(const MlaVerifyRefInputs& in, MlaVerifyRefOutputs* outputs);

// Element-wise comparison of a result with the reference. An output element passes when
//   |got - ref| <= 2^-8 * (|ref| + abs_weighted) + 1e-6
// which is twice what bf16 alone explains: the output's rounding (2^-9 |ref|) plus the
// probabilities rounded to bf16 before the P·V product (2^-9 * sum_k p_k |v_k|); float32
// accumulation adds far less. Two results compared with each other (`ref` then another kernel's
// rounded output) may each sit that far from the truth on either side: bound_scale 2. An LSE
// passes when |got - ref| <= 1e-3 + 1e-5 |ref|, and -inf only against -inf. NaN never passes.
struct MlaCompareResult {
  int64_t count = 0;
  int64_t bad = 0;  // elements beyond their bound (NaN included)
  int64_t nan = 0;
  double max_abs_err = 0.0;
  double max_err_over_bound = 0.0;  // worst |got - ref| / bound
  double rel_l2 = 0.0;              // ||got - ref|| / ||ref|| over the finite elements
  int64_t worst_index = -1;
  bool ok() const { return bad == 0 && count > 0; }
  // One finite element `got` against `want` within `bound`; adds to the L2 sums.
  void AddFinite(int64_t i, double got, double want, double bound, double* num, double* den);
};

MlaCompareResult CompareMlaOutput(const float* got, const double* ref, const double* abs_weighted,
                                  int64_t n, double bound_scale = 1.0);
MlaCompareResult CompareMlaLse(const float* got, const double* ref, int64_t n);

}  // namespace probesidecar::kernels
