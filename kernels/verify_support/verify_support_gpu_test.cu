// The Verify support kernels on the GPU: device-side input checks (sanitized lengths, flags,
// counts), the poison kernel, and the shadow comparison against a host computation.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/verify_support/verify_support.h"
#include "kernels/blocks/gpu_test_main.h"

namespace probesidecar::kernels {
namespace {

#define ASSERT_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call

template <typename T>
T* Upload(const std::vector<T>& host) {
  T* device = nullptr;
  EXPECT_EQ(cudaMalloc(&device, sizeof(T) * host.size()), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(device, host.data(), sizeof(T) * host.size(), cudaMemcpyHostToDevice),
            cudaSuccess);
  return device;
}

template <typename T>
std::vector<T> Download(const T* device, size_t n) {
  std::vector<T> host(n);
  EXPECT_EQ(cudaMemcpy(host.data(), device, sizeof(T) * n, cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

TEST(VerifySupportTest, InvalidLengthsAndTablesAreFlaggedSanitizedCountedAndPoisoned) {
  constexpr int kBatch = 6, kMaxPages = 4, kNumPages = 10, kSq = 2, kHq = 16;
  // Request: 0 ok; 1 length < s_q; 2 length past the table; 3 a page past the cache (in use);
  // 4 a bad entry beyond its length (never read: fine); 5 ok, length on a page boundary.
  const std::vector<int32_t> lengths = {70, 1, kMaxPages * 64 + 1, 130, 64, 128};
  std::vector<int32_t> table(kBatch * kMaxPages, 0);
  for (int i = 0; i < kBatch; ++i) {
    for (int k = 0; k < kMaxPages; ++k) table[i * kMaxPages + k] = (i + k) % kNumPages;
  }
  table[3 * kMaxPages + 2] = kNumPages;  // request 3: page 2 is in use (130 tokens = 3 pages)
  table[4 * kMaxPages + 1] = -1;         // request 4: only page 0 is in use
  int32_t* d_lengths = Upload(lengths);
  int32_t* d_table = Upload(table);
  int32_t* safe = nullptr;
  uint8_t* invalid = nullptr;
  uint32_t* counts = nullptr;
  ASSERT_CUDA(cudaMalloc(&safe, sizeof(int32_t) * kBatch));
  ASSERT_CUDA(cudaMalloc(&invalid, kBatch));
  ASSERT_CUDA(cudaHostAlloc(&counts, 2 * sizeof(uint32_t), cudaHostAllocMapped));
  counts[0] = 5;
  counts[1] = 99;
  VerifyInputCheckParams check;
  check.cache_seqlens = d_lengths;
  check.block_table = d_table;
  check.table_batch_stride = kMaxPages;
  check.batch = kBatch;
  check.s_q = kSq;
  check.max_pages = kMaxPages;
  check.num_pages = kNumPages;
  check.safe_seqlens = safe;
  check.invalid = invalid;
  ASSERT_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&check.invalid_counts), counts, 0));
  ASSERT_CUDA(LaunchCheckVerifyInputs(check, nullptr));
  // Poison the outputs of the invalid requests.
  const size_t out_elements = size_t{kBatch} * kSq * kHq * 512;
  std::vector<__nv_bfloat16> ones(out_elements, __float2bfloat16(1.0f));
  __nv_bfloat16* out = Upload(ones);
  std::vector<float> lse_ones(kBatch * kHq * kSq, 1.0f);
  float* lse = Upload(lse_ones);
  VerifyPoisonParams poison;
  poison.invalid = invalid;
  poison.batch = kBatch;
  poison.s_q = kSq;
  poison.h_q = kHq;
  poison.out = out;
  poison.out_batch_stride = kSq * kHq * 512;
  poison.out_token_stride = kHq * 512;
  poison.out_head_stride = 512;
  poison.lse = lse;
  poison.lse_batch_stride = kHq * kSq;
  poison.lse_head_stride = kSq;
  ASSERT_CUDA(LaunchPoisonInvalidVerifyRequests(poison, nullptr));
  ASSERT_CUDA(cudaDeviceSynchronize());
  const std::vector<int32_t> got_safe = Download(safe, kBatch);
  const std::vector<uint8_t> got_invalid = Download(invalid, kBatch);
  const bool want_invalid[kBatch] = {false, true, true, true, false, false};
  for (int i = 0; i < kBatch; ++i) {
    EXPECT_EQ(got_invalid[i] != 0, want_invalid[i]) << i;
    EXPECT_EQ(got_safe[i], want_invalid[i] ? 0 : lengths[i]) << i;
  }
  EXPECT_EQ(counts[0], 8u);
  EXPECT_EQ(counts[1], 3u);
  const std::vector<__nv_bfloat16> got_out = Download(out, out_elements);
  const std::vector<float> got_lse = Download(lse, lse_ones.size());
  for (int i = 0; i < kBatch; ++i) {
    for (size_t e = 0; e < size_t{kSq} * kHq * 512; ++e) {
      const float v = __bfloat162float(got_out[i * kSq * kHq * 512 + e]);
      ASSERT_EQ(std::isnan(v), want_invalid[i]) << i << " " << e;
    }
    for (int e = 0; e < kHq * kSq; ++e) {
      ASSERT_EQ(std::isnan(got_lse[i * kHq * kSq + e]), want_invalid[i]) << i << " " << e;
    }
  }
  cudaFree(d_lengths);
  cudaFree(d_table);
  cudaFree(safe);
  cudaFree(invalid);
  cudaFreeHost(counts);
  cudaFree(out);
  cudaFree(lse);
}

TEST(VerifySupportTest, CompareMatchesAHostComputationAndIsDeterministic) {
  constexpr int kBatch = 3, kSq = 4, kHq = 32;
  const size_t n = size_t{kBatch} * kSq * kHq * 512;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  std::vector<__nv_bfloat16> a(n), b(n);
  for (size_t e = 0; e < n; ++e) {
    const float y = normal(rng);
    b[e] = __float2bfloat16(y);
    a[e] = __float2bfloat16(y * (1.0f + 0.002f * normal(rng)));
  }
  a[12345] = __float2bfloat16(__bfloat162float(b[12345]) + 3.0f);  // one clear mismatch
  a[777] = __float2bfloat16(NAN);                                  // a NaN counts as one
  double max_abs = 0, sum_sq_diff = 0, sum_sq_ref = 0;
  uint64_t mismatched = 0;
  const float atol = 0.01f, rtol = 0.02f;
  for (size_t e = 0; e < n; ++e) {
    const double x = __bfloat162float(a[e]), y = __bfloat162float(b[e]);
    const double d = std::fabs(x - y);
    const bool finite = std::isfinite(x) && std::isfinite(y);
    if (!finite || d > atol + rtol * std::fabs(y)) ++mismatched;
    if (finite) {
      max_abs = std::max(max_abs, d);
      sum_sq_diff += d * d;
      sum_sq_ref += y * y;
    }
  }
  __nv_bfloat16* d_a = Upload(a);
  __nv_bfloat16* d_b = Upload(b);
  VerifyCompareResult* partials = nullptr;
  VerifyCompareResult* result = nullptr;
  ASSERT_CUDA(cudaMalloc(&partials, sizeof(VerifyCompareResult) * kVerifyCompareBlocks));
  ASSERT_CUDA(cudaMalloc(&result, sizeof(VerifyCompareResult)));
  VerifyCompareParams p;
  p.a = d_a;
  p.b = d_b;
  p.a_batch_stride = p.b_batch_stride = kSq * kHq * 512;
  p.a_token_stride = p.b_token_stride = kHq * 512;
  p.a_head_stride = p.b_head_stride = 512;
  p.batch = kBatch;
  p.s_q = kSq;
  p.h_q = kHq;
  p.atol = atol;
  p.rtol = rtol;
  p.partials = partials;
  p.result = result;
  VerifyCompareResult first{}, second{};
  for (VerifyCompareResult* r : {&first, &second}) {
    ASSERT_CUDA(LaunchVerifyCompare(p, nullptr));
    ASSERT_CUDA(cudaMemcpy(r, result, sizeof(*r), cudaMemcpyDeviceToHost));
  }
  EXPECT_EQ(first.compared, n);
  EXPECT_EQ(first.mismatched, mismatched);
  EXPECT_GE(first.mismatched, 2u);
  EXPECT_DOUBLE_EQ(first.max_abs_error, max_abs);
  EXPECT_NEAR(first.sum_sq_diff, sum_sq_diff, 1e-9 * sum_sq_diff);
  EXPECT_NEAR(first.sum_sq_ref, sum_sq_ref, 1e-9 * sum_sq_ref);
  // Bit for bit the same on a second run (fixed reduction order).
  EXPECT_EQ(std::memcmp(&first, &second, sizeof(first)), 0);
  cudaFree(d_a);
  cudaFree(d_b);
  cudaFree(partials);
  cudaFree(result);
}

}  // namespace
}  // namespace probesidecar::kernels

int main(int argc, char** argv) {
  return probesidecar::kernels::gpu_test::RunGpuTests(argc, argv);
}
