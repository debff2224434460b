// Verify request validation without a server: a valid request and every refusal.
#include "server/requests/verify_job.h"

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace probesidecar::server {
namespace {

constexpr int64_t kBatch = 2, kSq = 2, kHq = 16, kPages = 8, kMaxPages = 3;

// Buffer 7: 1 GiB at a 16-byte-aligned fake address; it and events 5 and 6 belong to session 1.
class FakeBuffers final : public BufferResolver {
 public:
  // Buffer 7 is on device 0, buffer 11 on device 2.
  absl::StatusOr<BufferLease> Acquire(uint64_t id, uint64_t offset, uint64_t extent,
                                      uint64_t session) override {
    if (id != 7 && id != 11) return absl::NotFoundError("buffer is not registered");
    if (session != 1) return absl::PermissionDeniedError("belongs to another session");
    if (offset + extent > (uint64_t{1} << 30)) return absl::InvalidArgumentError("past the end");
    return BufferLease{reinterpret_cast<char*>(id == 7 ? 0x100000 : 0x900000) + offset,
                       id == 7 ? 0 : 2, nullptr};
  }
  absl::StatusOr<EventLease> AcquireEvent(uint64_t id, uint64_t session) override {
    if (id == 8) return absl::PermissionDeniedError("belongs to another session");  // session 2's
    if (id != 5 && id != 6) return absl::NotFoundError("event is not registered");
    if (session != 1) return absl::PermissionDeniedError("belongs to another session");
    return EventLease{reinterpret_cast<void*>(0x500 + id), nullptr};
  }
};

void Device(v1::TensorRef* ref, v1::DType dtype, std::vector<int64_t> shape, uint64_t offset) {
  ref->Clear();
  ref->set_dtype(dtype);
  for (int64_t d : shape) ref->add_shape(d);
  ref->mutable_buffer()->set_buffer_id(7);
  ref->mutable_buffer()->set_offset_bytes(offset);
}

template <typename T>
std::string Bytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), sizeof(T) * values.size());
}

v1::VerifyRequest Good() {
  v1::VerifyRequest r;
  r.set_session_id(1);
  Device(r.mutable_q(), v1::DTYPE_BFLOAT16, {kBatch, kSq, kHq, 576}, 0);
  Device(r.mutable_kv_cache(), v1::DTYPE_BFLOAT16, {kPages, 64, 576}, 1 << 20);
  Device(r.mutable_out(), v1::DTYPE_BFLOAT16, {kBatch, kSq, kHq, 512}, 64 << 20);
  Device(r.mutable_lse(), v1::DTYPE_FLOAT32, {kBatch, kHq, kSq}, 96 << 20);
  v1::TensorRef* table = r.mutable_block_table();
  table->set_dtype(v1::DTYPE_INT32);
  table->add_shape(kBatch);
  table->add_shape(kMaxPages);
  table->set_data(Bytes(std::vector<int32_t>{0, 5, 7, 3, 1, 2}));
  v1::TensorRef* lengths = r.mutable_cache_seqlens();
  lengths->set_dtype(v1::DTYPE_INT32);
  lengths->add_shape(kBatch);
  lengths->set_data(Bytes(std::vector<int32_t>{130, 64}));
  r.set_softmax_scale(0.0416f);
  return r;
}

absl::StatusOr<VerifyJob> Prepare(const v1::VerifyRequest& r) {
  FakeBuffers buffers;
  return PrepareVerifyJob(r, &buffers, VerifyLimits{});
}

TEST(VerifyJobTest, AJobRunsOnTheDeviceOfItsBuffersAndMixingDevicesIsRefused) {
  absl::StatusOr<VerifyJob> on_0 = Prepare(Good());
  ASSERT_TRUE(on_0.ok()) << on_0.status();
  EXPECT_EQ(on_0->device, 0);
  v1::VerifyRequest on_2 = Good();
  for (v1::TensorRef* ref :
       {on_2.mutable_q(), on_2.mutable_kv_cache(), on_2.mutable_out(), on_2.mutable_lse()}) {
    ref->mutable_buffer()->set_buffer_id(11);
  }
  absl::StatusOr<VerifyJob> job = Prepare(on_2);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->device, 2);
  v1::VerifyRequest mixed = Good();
  mixed.mutable_kv_cache()->mutable_buffer()->set_buffer_id(11);
  job = Prepare(mixed);
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(job.status().message().find("q is on CUDA device 0 and kv_cache on device 2"),
            absl::string_view::npos)
      << job.status().message();
}

TEST(VerifyJobTest, AValidRequestHasItsShapesStridesAndPointers) {
  absl::StatusOr<VerifyJob> job = Prepare(Good());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->batch, kBatch);
  EXPECT_EQ(job->s_q, kSq);
  EXPECT_EQ(job->h_q, kHq);
  EXPECT_EQ(job->q_batch_stride, kSq * kHq * 576);
  EXPECT_EQ(job->kv_page_stride, 64 * 576);
  EXPECT_EQ(job->num_pages, kPages);
  EXPECT_EQ(job->max_pages, kMaxPages);
  EXPECT_EQ(job->out_batch_stride, kSq * kHq * 512);
  EXPECT_EQ(job->lse_batch_stride, kHq * kSq);
  EXPECT_FALSE(job->block_table.on_device());
  EXPECT_FALSE(job->shadow);
  EXPECT_EQ(job->kv_cache.device_ptr, reinterpret_cast<char*>(0x100000) + (1 << 20));
}

TEST(VerifyJobTest, ShadowModeNeedsNoOutputAndTakesTheDefaultTolerance) {
  v1::VerifyRequest r = Good();
  r.clear_out();
  r.clear_lse();
  Device(r.mutable_compare_to(), v1::DTYPE_BFLOAT16, {kBatch, kSq, kHq, 512}, 128 << 20);
  absl::StatusOr<VerifyJob> job = Prepare(r);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_TRUE(job->shadow);
  EXPECT_EQ(job->out.device_ptr, nullptr);
  EXPECT_FLOAT_EQ(job->atol, kDefaultShadowAtol);
  EXPECT_FLOAT_EQ(job->rtol, kDefaultShadowRtol);
  r.set_shadow_rtol(0.1f);
  EXPECT_FLOAT_EQ(Prepare(r)->rtol, 0.1f);
}

TEST(VerifyJobTest, DeviceTablesAreLeftToTheGpuAndEventsAreResolved) {
  v1::VerifyRequest r = Good();
  Device(r.mutable_block_table(), v1::DTYPE_INT32, {kBatch, kMaxPages}, 200 << 20);
  Device(r.mutable_cache_seqlens(), v1::DTYPE_INT32, {kBatch}, 201 << 20);
  r.set_session_id(1);
  r.set_ready_event(5);
  r.set_done_event(6);
  absl::StatusOr<VerifyJob> job = Prepare(r);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_TRUE(job->block_table.on_device());
  EXPECT_TRUE(job->cache_seqlens.on_device());
  EXPECT_EQ(job->ready.event, reinterpret_cast<void*>(0x505));
}

// Found by fuzz_verify_request (tests/fuzz/verify_request/regressions/long-shape-listed): a
// shape of hundreds of dimensions came back whole in the refusal, so a hostile request could grow
// the message (and the response's metadata) without bound.
TEST(VerifyJobTest, ALongShapeIsCountedNotListed) {
  v1::VerifyRequest r = Good();
  r.mutable_q()->mutable_shape()->Resize(5000, 7);
  const absl::Status status = Prepare(r).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("got [2, 2, 16, 576, 7, 7, 7, 7, ... (5000 dimensions)]"),
            std::string::npos)
      << status;
  EXPECT_LT(status.message().size(), 200u);
}

TEST(VerifyJobTest, EveryRefusal) {
  struct Case {
    std::function<void(v1::VerifyRequest&)> mutate;
    absl::StatusCode code;
    const char* fragment;
  };
  auto lengths = [](std::vector<int32_t> v) {
    return [v](v1::VerifyRequest& r) { r.mutable_cache_seqlens()->set_data(Bytes(v)); };
  };
  const std::vector<Case> cases = {
      {[](auto& r) { r.mutable_q()->set_dtype(v1::DTYPE_FLOAT16); },
       absl::StatusCode::kInvalidArgument, "q: dtype must be DTYPE_BFLOAT16"},
      {[](auto& r) { r.mutable_q()->set_shape(3, 512); }, absl::StatusCode::kInvalidArgument,
       "q: shape must be [b, s_q, h_q, 576]"},
      {[](auto& r) { r.mutable_q()->set_shape(2, 24); }, absl::StatusCode::kInvalidArgument,
       "h_q = 24"},
      {[](auto& r) { r.mutable_q()->set_shape(1, 17); }, absl::StatusCode::kInvalidArgument,
       "s_q = 17"},
      {[](auto& r) { r.mutable_q()->set_shape(0, 257); }, absl::StatusCode::kResourceExhausted,
       "limit of 256"},
      {[](auto& r) { r.mutable_q()->set_row_stride(kSq * kHq * 576 + 4); },
       absl::StatusCode::kInvalidArgument, "multiple of 8"},
      {[](auto& r) { r.mutable_q()->mutable_buffer()->set_offset_bytes(8); },
       absl::StatusCode::kInvalidArgument, "misaligned"},
      {[](auto& r) { r.mutable_q()->mutable_buffer()->set_buffer_id(9); },
       absl::StatusCode::kNotFound, "q: buffer is not registered"},
      {[](auto& r) { r.mutable_q()->set_data("x"); }, absl::StatusCode::kInvalidArgument,
       "q: must name a registered buffer"},
      {[](auto& r) { r.mutable_kv_cache()->set_shape(1, 32); }, absl::StatusCode::kInvalidArgument,
       "kv_cache: shape must be [pages, 64, 576]"},
      {[](auto& r) { r.mutable_kv_cache()->mutable_buffer()->set_offset_bytes(1 << 30); },
       absl::StatusCode::kInvalidArgument, "past the end"},
      {[](auto& r) { r.mutable_block_table()->set_shape(0, 3); },
       absl::StatusCode::kInvalidArgument, "block_table: shape must be [b, max_pages] with b = 2"},
      {[](auto& r) { r.mutable_block_table()->set_dtype(v1::DTYPE_FLOAT32); },
       absl::StatusCode::kInvalidArgument, "block_table: dtype must be DTYPE_INT32"},
      {[](auto& r) { r.mutable_block_table()->set_data("abc"); },
       absl::StatusCode::kInvalidArgument, "block_table: inline data holds 3 bytes"},
      {[](auto& r) { r.mutable_cache_seqlens()->add_shape(1); }, absl::StatusCode::kInvalidArgument,
       "cache_seqlens: shape must be [b]"},
      {[](auto& r) { r.mutable_cache_seqlens()->set_row_stride(-1); },
       absl::StatusCode::kInvalidArgument,
       "cache_seqlens: must be contiguous (row_stride 0 or 1, not -1)"},
      {[](auto& r) { r.mutable_cache_seqlens()->set_row_stride(2); },
       absl::StatusCode::kInvalidArgument, "cache_seqlens: must be contiguous"},
      // A length smaller than s_q, one past its table, a table entry past the cache.
      {lengths({1, 64}), absl::StatusCode::kInvalidArgument, "smaller than s_q = 2"},
      {lengths({130, 3 * 64 + 1}), absl::StatusCode::kInvalidArgument, "past its page table"},
      {[](auto& r) {
         r.mutable_block_table()->set_data(Bytes(std::vector<int32_t>{0, 5, 8, 3, 1, 2}));
       },
       absl::StatusCode::kInvalidArgument, "block_table[0, 2] = 8 is outside the cache's 8 pages"},
      {[](auto& r) {
         r.mutable_block_table()->set_data(Bytes(std::vector<int32_t>{0, 5, 7, -1, 1, 2}));
       },
       absl::StatusCode::kInvalidArgument, "block_table[1, 0] = -1"},
      {[](auto& r) { r.set_softmax_scale(0); }, absl::StatusCode::kInvalidArgument,
       "softmax_scale"},
      {[](auto& r) { r.clear_out(); }, absl::StatusCode::kInvalidArgument, "out: missing"},
      {[](auto& r) { r.mutable_out()->set_shape(2, 32); }, absl::StatusCode::kInvalidArgument,
       "out: shape must be [b, s_q, h_q, 512]"},
      {[](auto& r) { r.mutable_lse()->set_shape(1, kSq); }, absl::StatusCode::kInvalidArgument,
       "lse: shape must be [b, h_q, s_q]"},
      {[](auto& r) {
         Device(r.mutable_compare_to(), v1::DTYPE_BFLOAT16, {kBatch, kSq, kHq, 576}, 0);
       },
       absl::StatusCode::kInvalidArgument, "compare_to: shape must be [b, s_q, h_q, 512]"},
      {[](auto& r) { r.set_session_id(0); }, absl::StatusCode::kPermissionDenied,
       "q: belongs to another session"},
      {[](auto& r) {
         r.set_session_id(1);
         r.set_done_event(8);
       },
       absl::StatusCode::kPermissionDenied, "done_event: belongs to another session"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    v1::VerifyRequest r = Good();
    cases[i].mutate(r);
    absl::StatusOr<VerifyJob> job = Prepare(r);
    ASSERT_FALSE(job.ok()) << i;
    EXPECT_EQ(job.status().code(), cases[i].code) << i << ": " << job.status();
    EXPECT_NE(job.status().message().find(cases[i].fragment), absl::string_view::npos)
        << i << ": " << job.status();
  }
  EXPECT_EQ(PrepareVerifyJob(Good(), nullptr, VerifyLimits{}).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace probesidecar::server
