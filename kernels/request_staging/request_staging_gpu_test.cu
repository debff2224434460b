// The staging kernel and the poison kernel on the GPU: arguments copied, rows staged from the
// parameters or a device buffer and checked, invalid rows counted and poisoned, and a captured
// graph whose staging node is updated per request replays each request's own rows.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/request_staging/request_staging.h"
#include "kernels/blocks/gpu_test_main.h"

namespace probesidecar::kernels {
namespace {

#define ASSERT_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call

struct Args {
  int64_t a = 0;
  int32_t b = 0;
  PoisonDescriptor poison;
};

class RequestStagingTest : public ::testing::Test {
 protected:
  static constexpr int kBucket = 64;
  static constexpr int kColumns = 5;
  void SetUp() override {
    ASSERT_CUDA(cudaStreamCreate(&stream_));
    ASSERT_CUDA(cudaMalloc(&args_dst_, kMaxStagedArgsBytes));
    ASSERT_CUDA(cudaMalloc(&rows_dst_, sizeof(int32_t) * kBucket));
    ASSERT_CUDA(cudaMalloc(&invalid_dst_, kBucket));
    ASSERT_CUDA(cudaMalloc(&device_rows_, sizeof(int32_t) * kBucket));
    ASSERT_CUDA(cudaMalloc(&out_, sizeof(float) * kBucket * kColumns));
    ASSERT_CUDA(cudaHostAlloc(&invalid_, 2 * sizeof(uint32_t), cudaHostAllocMapped));
    invalid_[0] = 0;
    invalid_[1] = 99;
    ASSERT_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&invalid_device_), invalid_, 0));
    // Poison the destinations: whatever the kernel does not write shows.
    ASSERT_CUDA(cudaMemset(rows_dst_, 0x7f, sizeof(int32_t) * kBucket));
    ASSERT_CUDA(cudaMemset(invalid_dst_, 0x7f, kBucket));
  }
  void TearDown() override {
    cudaFree(args_dst_);
    cudaFree(rows_dst_);
    cudaFree(invalid_dst_);
    cudaFree(device_rows_);
    cudaFree(out_);
    cudaFreeHost(invalid_);
    cudaStreamDestroy(stream_);
  }

  StageRequestParams Params(int32_t num_rows, int64_t tokens, const Args& args) {
    StageRequestParams p;
    p.args_dst = args_dst_;
    p.rows_dst = rows_dst_;
    p.invalid_dst = invalid_dst_;
    p.invalid_counts = invalid_device_;
    p.num_tokens = tokens;
    p.num_rows = num_rows;
    p.bucket = kBucket;
    p.args_bytes = sizeof(Args);
    std::memcpy(p.args, &args, sizeof(Args));
    return p;
  }

  std::vector<int32_t> Rows() {
    std::vector<int32_t> rows(kBucket);
    EXPECT_EQ(cudaMemcpy(rows.data(), rows_dst_, sizeof(int32_t) * kBucket, cudaMemcpyDeviceToHost),
              cudaSuccess);
    return rows;
  }

  cudaStream_t stream_ = nullptr;
  void* args_dst_ = nullptr;
  int32_t* rows_dst_ = nullptr;
  uint8_t* invalid_dst_ = nullptr;
  int32_t* device_rows_ = nullptr;
  float* out_ = nullptr;
  uint32_t* invalid_ = nullptr;  // mapped: [0] running total, [1] the last request's
  uint32_t* invalid_device_ = nullptr;
};

TEST_F(RequestStagingTest, InlineRowsAndArgumentsAreStagedAndPadded) {
  Args args{123456789012345, -7, {}};
  StageRequestParams p = Params(5, 1000, args);
  const int32_t rows[5] = {999, 0, 17, 17, 500};
  std::memcpy(p.inline_rows, rows, sizeof(rows));
  ASSERT_CUDA(LaunchStageRequest(p, stream_));
  ASSERT_CUDA(cudaStreamSynchronize(stream_));
  Args staged;
  ASSERT_CUDA(cudaMemcpy(&staged, args_dst_, sizeof(Args), cudaMemcpyDeviceToHost));
  EXPECT_EQ(staged.a, args.a);
  EXPECT_EQ(staged.b, args.b);
  const std::vector<int32_t> got = Rows();
  for (int r = 0; r < kBucket; ++r) EXPECT_EQ(got[r], r < 5 ? rows[r] : 0) << r;
  EXPECT_EQ(invalid_[0], 0u);
  EXPECT_EQ(invalid_[1], 0u);
}

TEST_F(RequestStagingTest, DeviceRowsOutOfRangeAreReplacedFlaggedCountedAndPoisoned) {
  const std::vector<int32_t> rows = {3, -1, 10, 9, 2147483647, 0};  // T = 10: three invalid
  ASSERT_CUDA(
      cudaMemcpy(device_rows_, rows.data(), sizeof(int32_t) * rows.size(), cudaMemcpyHostToDevice));
  std::vector<float> ones(kBucket * kColumns, 1.0f);
  ASSERT_CUDA(cudaMemcpy(out_, ones.data(), sizeof(float) * ones.size(), cudaMemcpyHostToDevice));
  Args args;
  args.poison = PoisonDescriptor{out_, kColumns, static_cast<int32_t>(rows.size()), 0};
  StageRequestParams p = Params(static_cast<int32_t>(rows.size()), 10, args);
  p.device_rows = device_rows_;
  ASSERT_CUDA(LaunchStageRequest(p, stream_));
  PoisonInvalidRowsParams poison;
  poison.descriptor = &static_cast<Args*>(args_dst_)->poison;  // device address in the block
  poison.invalid = invalid_dst_;
  poison.bucket = kBucket;
  poison.num_columns = kColumns;
  ASSERT_CUDA(LaunchPoisonInvalidRows(poison, stream_));
  ASSERT_CUDA(cudaStreamSynchronize(stream_));
  const std::vector<int32_t> got = Rows();
  const std::vector<int32_t> want = {3, 0, 0, 9, 0, 0};
  for (int r = 0; r < kBucket; ++r) EXPECT_EQ(got[r], r < 6 ? want[r] : 0) << r;
  EXPECT_EQ(invalid_[0], 3u);
  EXPECT_EQ(invalid_[1], 3u);
  // The same request again: the running total grows, the last count is this request's.
  ASSERT_CUDA(LaunchStageRequest(p, stream_));
  ASSERT_CUDA(cudaStreamSynchronize(stream_));
  EXPECT_EQ(invalid_[0], 6u);
  EXPECT_EQ(invalid_[1], 3u);
  std::vector<float> out(kBucket * kColumns);
  ASSERT_CUDA(cudaMemcpy(out.data(), out_, sizeof(float) * out.size(), cudaMemcpyDeviceToHost));
  for (int r = 0; r < kBucket; ++r) {
    const bool bad = r == 1 || r == 2 || r == 4;
    for (int c = 0; c < kColumns; ++c) {
      EXPECT_EQ(std::isnan(out[r * kColumns + c]), bad) << r << "," << c;
    }
  }
}

TEST_F(RequestStagingTest, AGraphNodeUpdatedPerRequestStagesEachRequestsRows) {
  Args args;
  StageRequestParams p = Params(3, 100, args);
  p.inline_rows[0] = 1;
  p.inline_rows[1] = 2;
  p.inline_rows[2] = 3;
  cudaGraph_t graph = nullptr;
  ASSERT_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  ASSERT_CUDA(LaunchStageRequest(p, stream_));
  ASSERT_CUDA(cudaStreamEndCapture(stream_, &graph));
  size_t count = 0;
  ASSERT_CUDA(cudaGraphGetNodes(graph, nullptr, &count));
  ASSERT_EQ(count, 1u);
  cudaGraphNode_t node = nullptr;
  ASSERT_CUDA(cudaGraphGetNodes(graph, &node, &count));
  cudaGraphExec_t exec = nullptr;
  ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  // Two requests queued back to back: each replay sees its own rows.
  std::vector<int32_t> first, second;
  for (int request = 0; request < 2; ++request) {
    StageRequestParams q = Params(request == 0 ? 2 : 4, 100, args);
    for (int r = 0; r < q.num_rows; ++r) q.inline_rows[r] = 10 * (request + 1) + r;
    void* storage[1];
    cudaKernelNodeParams node_params;
    ASSERT_CUDA(StageRequestNodeParams(&q, storage, &node_params));
    ASSERT_CUDA(cudaGraphExecKernelNodeSetParams(exec, node, &node_params));
    ASSERT_CUDA(cudaGraphLaunch(exec, stream_));
    ASSERT_CUDA(cudaStreamSynchronize(stream_));
    (request == 0 ? first : second) = Rows();
  }
  EXPECT_EQ(first[0], 10);
  EXPECT_EQ(first[1], 11);
  EXPECT_EQ(first[2], 0);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(second[r], 20 + r);
  EXPECT_EQ(second[4], 0);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

TEST(RequestStagingValidation, OutOfRangeParamsAreRefused) {
  StageRequestParams p;
  EXPECT_EQ(LaunchStageRequest(p, nullptr), cudaErrorInvalidValue);  // no destination
  int dummy = 0;
  p.args_dst = &dummy;
  p.args_bytes = kMaxStagedArgsBytes + 1;
  EXPECT_EQ(LaunchStageRequest(p, nullptr), cudaErrorInvalidValue);
  p.args_bytes = 8;
  p.rows_dst = &dummy;
  p.bucket = 4096;
  p.num_rows = kMaxInlineRows + 1;  // inline rows past what the parameters carry
  EXPECT_EQ(LaunchStageRequest(p, nullptr), cudaErrorInvalidValue);
  p.num_rows = 8;
  p.bucket = 4;  // more rows than the bucket
  EXPECT_EQ(LaunchStageRequest(p, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace probesidecar::kernels

int main(int argc, char** argv) {
  return probesidecar::kernels::gpu_test::RunGpuTests(argc, argv);
}
