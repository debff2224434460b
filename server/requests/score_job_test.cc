// Request validation without a server: every refusal, and what a valid job points at.
#include "server/requests/score_job.h"

#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/safetensors.h"
#include "gtest/gtest.h"

namespace probesidecar::server {
namespace {

constexpr int32_t kHidden = 8;
constexpr int32_t kProbes = 3;

std::string Floats(size_t n) { return std::string(n * sizeof(float), '\0'); }

// A resolver that knows buffers of 4096 bytes at fake device addresses: 7 on device 0, 11 on
// device 1.
class FakeBuffers final : public BufferResolver {
 public:
  // Buffers 7 and 11 belong to session 1.
  absl::StatusOr<BufferLease> Acquire(uint64_t id, uint64_t offset, uint64_t extent,
                                      uint64_t session) override {
    if (id == 11 && session == 1 && offset + extent <= 4096) {
      ++acquired;
      return BufferLease{reinterpret_cast<char*>(0x90000) + offset, 1, nullptr};
    }
    if (id != 7) return absl::NotFoundError("buffer is not registered");
    if (session != 1) return absl::PermissionDeniedError("belongs to another session");
    if (offset + extent > 4096) return absl::InvalidArgumentError("past the end");
    ++acquired;
    return BufferLease{reinterpret_cast<char*>(0x10000) + offset, 0, nullptr};
  }
  // Events 5 and 6 (device 0) and 10 (device 1) belong to session 1.
  absl::StatusOr<EventLease> AcquireEvent(uint64_t id, uint64_t session) override {
    if (id == 10 && session == 1) return EventLease{reinterpret_cast<void*>(0x510), nullptr, 1};
    if (id == 8) return absl::PermissionDeniedError("belongs to another session");  // session 2's
    if (id != 5 && id != 6) return absl::NotFoundError("event is not registered");
    if (session != 1) return absl::PermissionDeniedError("belongs to another session");
    return EventLease{reinterpret_cast<void*>(0x500 + id), nullptr};
  }
  int acquired = 0;
};

class ScoreJobTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string weight = Floats(kProbes * kHidden);
    const std::string bias = Floats(kProbes);
    std::string file = common::WriteSafetensors(
        {{"weight", "F32", {kProbes, kHidden}, weight}, {"bias", "F32", {kProbes}, bias}}, {});
    ASSERT_TRUE(registry_.LoadFromBytes("p", file, false).ok());
  }

  v1::ScoreRequest Good() {
    v1::ScoreRequest r;
    r.set_probe_set("p");
    r.mutable_activations()->set_dtype(v1::DTYPE_FLOAT32);
    r.mutable_activations()->add_shape(4);
    r.mutable_activations()->add_shape(kHidden);
    r.mutable_activations()->set_data(Floats(4 * kHidden));
    r.add_rows(3);
    r.add_rows(0);
    return r;
  }

  absl::StatusOr<ScoreJob> Prepare(const v1::ScoreRequest& r, BufferResolver* buffers = nullptr) {
    return PrepareScoreJob(r, registry_, buffers, limits_, &scores_);
  }

  ProbeRegistry registry_{"", ProbeSetLimits{}, [](ProbeSet&) { return absl::OkStatus(); }};
  ScoreLimits limits_{100, 1 << 20};
  std::string scores_;
};

TEST_F(ScoreJobTest, ValidRequestPointsIntoTheRequestAndTheScores) {
  const v1::ScoreRequest r = Good();
  absl::StatusOr<ScoreJob> job = Prepare(r);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->num_rows, 2);
  EXPECT_EQ(job->rows, r.rows().data());
  EXPECT_EQ(job->activations.host, r.activations().data().data());
  EXPECT_EQ(job->activations.row_stride, kHidden);
  EXPECT_EQ(scores_.size(), 2u * kProbes * sizeof(float));
  EXPECT_EQ(reinterpret_cast<char*>(job->host_out), scores_.data());
}

TEST_F(ScoreJobTest, StridedInlineDataBetweenExtentAndFullRows) {
  v1::ScoreRequest r = Good();
  r.mutable_activations()->set_row_stride(10);
  r.mutable_activations()->set_data(Floats(3 * 10 + kHidden));  // the extent exactly
  EXPECT_TRUE(Prepare(r).ok());
  r.mutable_activations()->set_data(Floats(4 * 10));  // full last row
  EXPECT_TRUE(Prepare(r).ok());
  r.mutable_activations()->set_data(Floats(4 * 10 + 1));
  EXPECT_EQ(Prepare(r).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ScoreJobTest, EveryRefusal) {
  struct Case {
    std::function<void(v1::ScoreRequest&)> mutate;
    absl::StatusCode code;
    const char* fragment;
  };
  const std::vector<Case> cases = {
      {[](auto& r) { r.set_probe_set(""); }, absl::StatusCode::kInvalidArgument, "probe_set"},
      {[](auto& r) { r.set_probe_set("q"); }, absl::StatusCode::kNotFound,
       "probe set \"q\" is not loaded"},
      {[](auto& r) { r.clear_rows(); }, absl::StatusCode::kInvalidArgument, "rows: empty"},
      {[](auto& r) { r.mutable_rows()->Resize(101, 0); }, absl::StatusCode::kResourceExhausted,
       "--max-rows"},
      {[](auto& r) { r.add_rows(4); }, absl::StatusCode::kInvalidArgument, "rows[2] = 4"},
      {[](auto& r) { r.add_rows(-2); }, absl::StatusCode::kInvalidArgument, "rows[2] = -2"},
      {[](auto& r) { r.clear_activations(); }, absl::StatusCode::kInvalidArgument, "missing"},
      {[](auto& r) { r.mutable_activations()->set_dtype(v1::DTYPE_INT32); },
       absl::StatusCode::kInvalidArgument, "DTYPE_INT32"},
      {[](auto& r) { r.mutable_activations()->set_shape(1, kHidden + 1); },
       absl::StatusCode::kInvalidArgument, "inline data holds"},
      {[](auto& r) {
         r.mutable_activations()->set_shape(1, 4);
         r.mutable_activations()->set_shape(0, 8);
       },
       absl::StatusCode::kInvalidArgument, "hidden size 4 does not match"},
      {[](auto& r) { r.mutable_activations()->set_row_stride(kHidden - 1); },
       absl::StatusCode::kInvalidArgument, "smaller than the row length"},
      {[](auto& r) { r.mutable_activations()->set_shape(0, INT64_MAX); },
       absl::StatusCode::kInvalidArgument, "valid extent"},
      {[](auto& r) { r.mutable_activations()->mutable_buffer()->set_buffer_id(7); },
       absl::StatusCode::kFailedPrecondition, "CUDA backend"},
      {[](auto& r) {
         r.mutable_output()->set_dtype(v1::DTYPE_FLOAT32);
         r.mutable_output()->set_data("x");
       },
       absl::StatusCode::kInvalidArgument, "output: must name a registered buffer"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    v1::ScoreRequest r = Good();
    cases[i].mutate(r);
    absl::StatusOr<ScoreJob> job = Prepare(r);
    ASSERT_FALSE(job.ok()) << i;
    EXPECT_EQ(job.status().code(), cases[i].code) << i << ": " << job.status();
    EXPECT_NE(job.status().message().find(cases[i].fragment), absl::string_view::npos)
        << i << ": " << job.status();
  }
}

TEST_F(ScoreJobTest, ScoresLargerThanAMessageAreRefused) {
  limits_.max_message_bytes = 2048;
  v1::ScoreRequest r = Good();
  r.mutable_rows()->Resize(80, 1);  // 80 x 3 floats = 960 bytes, + 1024 of headroom: fits
  EXPECT_TRUE(Prepare(r).ok());
  r.mutable_rows()->Resize(100, 1);  // 1200 + 1024 > 2048: refused
  EXPECT_EQ(Prepare(r).status().code(), absl::StatusCode::kResourceExhausted);
}

// Found by fuzz_score_request (tests/fuzz/score_request/regressions/unknown-name-echoed-raw): an
// unknown probe-set name came back whole in the message, control characters and all, so a
// hostile name could forge log lines and, at 10 KB and more, outgrow the response's metadata.
TEST_F(ScoreJobTest, UnknownProbeSetNameIsQuotedEscapedAndCut) {
  v1::ScoreRequest r = Good();
  r.set_probe_set(absl::StrCat("evil\n\x1b[31m", std::string(20000, 'x')));
  const absl::Status status = Prepare(r).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(status.message(), R"(probe set "evil\x0a\x1b[31mxxx)")) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "(20010 bytes)")) << status;
  EXPECT_LT(status.message().size(), 300u);
  for (char c : status.message()) EXPECT_GE(static_cast<unsigned char>(c), 0x20);
}

// A row stride near 2^62 wrapped row_stride * element size to 0: one row of 8 floats with 4000
// bytes of data was refused as needing "between 32 and 0 bytes" (and data that fit was refused).
TEST_F(ScoreJobTest, HugeRowStrideDoesNotWrapTheInlineSizeBound) {
  v1::ScoreRequest r = Good();
  r.clear_rows();
  r.add_rows(0);
  r.mutable_activations()->set_shape(0, 1);
  r.mutable_activations()->set_row_stride(int64_t{1} << 62);
  r.mutable_activations()->set_data(Floats(1000));
  EXPECT_TRUE(Prepare(r).ok()) << Prepare(r).status();  // 4000 bytes: within [32, 2^64)
  r.mutable_activations()->set_data(Floats(7));
  const absl::Status status = Prepare(r).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(status.message(), "needs at least 32 bytes")) << status;
}

// The same defect as VerifyJobTest.ALongShapeIsCountedNotListed, in Score's tensor references.
TEST_F(ScoreJobTest, ALongShapeIsCountedNotListed) {
  v1::ScoreRequest r = Good();
  r.mutable_activations()->mutable_shape()->Resize(5000, 7);
  const absl::Status status = Prepare(r).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      absl::StrContains(status.message(), "got [4, 8, 7, 7, 7, 7, 7, 7, ... (5000 dimensions)]"))
      << status;
  EXPECT_LT(status.message().size(), 200u);
}

TEST_F(ScoreJobTest, BufferActivationsAndOutputAreLeasedAndChecked) {
  FakeBuffers buffers;
  v1::ScoreRequest r = Good();
  r.set_session_id(1);
  r.mutable_activations()->mutable_buffer()->set_buffer_id(7);
  r.mutable_activations()->mutable_buffer()->set_offset_bytes(64);
  v1::TensorRef* out = r.mutable_output();
  out->set_dtype(v1::DTYPE_FLOAT32);
  out->add_shape(2);
  out->add_shape(kProbes);
  out->mutable_buffer()->set_buffer_id(7);
  out->mutable_buffer()->set_offset_bytes(1024);
  absl::StatusOr<ScoreJob> job = Prepare(r, &buffers);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(buffers.acquired, 2);
  EXPECT_TRUE(job->activations.on_device());
  EXPECT_EQ(job->activations.device.device_ptr, reinterpret_cast<char*>(0x10000) + 64);
  EXPECT_EQ(job->host_out, nullptr);
  EXPECT_EQ(job->device_out.device.device_ptr, reinterpret_cast<char*>(0x10000) + 1024);
  EXPECT_TRUE(scores_.empty());

  r.mutable_activations()->mutable_buffer()->set_offset_bytes(4096 - 16);  // extent past the end
  EXPECT_EQ(Prepare(r, &buffers).status().code(), absl::StatusCode::kInvalidArgument);
  r.mutable_activations()->mutable_buffer()->set_offset_bytes(2);  // misaligned for fp32
  EXPECT_NE(Prepare(r, &buffers).status().message().find("misaligned"), absl::string_view::npos);
  r.mutable_activations()->mutable_buffer()->set_offset_bytes(0);
  r.mutable_activations()->mutable_buffer()->set_buffer_id(8);
  EXPECT_EQ(Prepare(r, &buffers).status().code(), absl::StatusCode::kNotFound);
  r.mutable_activations()->mutable_buffer()->set_buffer_id(7);
  out->set_shape(1, kProbes + 1);
  EXPECT_NE(Prepare(r, &buffers).status().message().find("shape must be [R, P] = [2, 3]"),
            absl::string_view::npos);
  out->set_shape(1, kProbes);
  out->set_dtype(v1::DTYPE_BFLOAT16);
  EXPECT_NE(Prepare(r, &buffers).status().message().find("DTYPE_FLOAT32"), absl::string_view::npos);
}

// A request with activations in buffer 7, rows in buffer 7 at `rows_offset`, output in buffer 7.
v1::ScoreRequest DeviceRequest(int64_t rows, uint64_t rows_offset = 2048) {
  v1::ScoreRequest r;
  r.set_probe_set("p");
  r.set_session_id(1);
  v1::TensorRef* x = r.mutable_activations();
  x->set_dtype(v1::DTYPE_FLOAT32);
  x->add_shape(4);
  x->add_shape(kHidden);
  x->mutable_buffer()->set_buffer_id(7);
  v1::TensorRef* d = r.mutable_device_rows();
  d->set_dtype(v1::DTYPE_INT32);
  d->add_shape(rows);
  d->mutable_buffer()->set_buffer_id(7);
  d->mutable_buffer()->set_offset_bytes(rows_offset);
  v1::TensorRef* out = r.mutable_output();
  out->set_dtype(v1::DTYPE_FLOAT32);
  out->add_shape(rows);
  out->add_shape(kProbes);
  out->mutable_buffer()->set_buffer_id(7);
  out->mutable_buffer()->set_offset_bytes(1024);
  return r;
}

TEST_F(ScoreJobTest, DeviceRowsAndEventsMakeAnEnqueueOnlyJob) {
  FakeBuffers buffers;
  v1::ScoreRequest r = DeviceRequest(3);
  r.set_session_id(1);
  r.set_ready_event(5);
  r.set_done_event(6);
  absl::StatusOr<ScoreJob> job = Prepare(r, &buffers);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_TRUE(job->rows_on_device());
  EXPECT_EQ(job->num_rows, 3);
  EXPECT_EQ(job->device_rows.size, 3);
  EXPECT_EQ(job->device_rows.device.device_ptr, reinterpret_cast<char*>(0x10000) + 2048);
  EXPECT_EQ(job->ready.event, reinterpret_cast<void*>(0x505));
  EXPECT_EQ(job->done.event, reinterpret_cast<void*>(0x506));
  EXPECT_TRUE(job->enqueue_only);
  // Without a done event, or with the scores inline, the answer waits for the GPU.
  r.set_done_event(0);
  EXPECT_FALSE(Prepare(r, &buffers)->enqueue_only);
  r.set_done_event(6);
  r.clear_output();
  EXPECT_FALSE(Prepare(r, &buffers)->enqueue_only);
}

// counted_rows: G int32 counts in the session's buffer, G dividing R; refused without buffers.
TEST_F(ScoreJobTest, CountedRowsAreGroupsOfTheRows) {
  FakeBuffers buffers;
  v1::ScoreRequest r = DeviceRequest(4);
  v1::TensorRef* counted = r.mutable_counted_rows();
  counted->set_dtype(v1::DTYPE_INT32);
  counted->add_shape(2);
  counted->mutable_buffer()->set_buffer_id(7);
  counted->mutable_buffer()->set_offset_bytes(3072);
  absl::StatusOr<ScoreJob> job = Prepare(r, &buffers);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->counted_rows.size, 2);
  EXPECT_EQ(job->counted_rows.device.device_ptr, reinterpret_cast<char*>(0x10000) + 3072);
  counted->set_shape(0, 3);  // 4 rows are not groups of 3
  EXPECT_NE(Prepare(r, &buffers).status().message().find("R must be a multiple of G"),
            absl::string_view::npos);
  counted->set_shape(0, 8);  // more groups than rows
  EXPECT_EQ(Prepare(r, &buffers).status().code(), absl::StatusCode::kInvalidArgument);
  counted->set_shape(0, 2);
  counted->set_dtype(v1::DTYPE_FLOAT32);
  EXPECT_NE(Prepare(r, &buffers).status().message().find("counted_rows: dtype must be DTYPE_INT32"),
            absl::string_view::npos);
  counted->set_dtype(v1::DTYPE_INT32);
  r.set_session_id(2);  // another session's buffer
  EXPECT_EQ(Prepare(r, &buffers).status().code(), absl::StatusCode::kPermissionDenied);
  // Without buffers (the CPU backend) an inline request naming counted_rows is refused.
  v1::ScoreRequest inline_request = Good();
  *inline_request.mutable_counted_rows() = *counted;
  EXPECT_EQ(Prepare(inline_request).status().code(), absl::StatusCode::kFailedPrecondition);
}

// A request runs on the device of its buffers and events; an inline request names none; buffers
// or events on two devices are refused, and the refusal names both.
TEST_F(ScoreJobTest, AJobRunsOnTheOneDeviceOfItsBuffersAndEvents) {
  FakeBuffers buffers;
  absl::StatusOr<ScoreJob> inline_job = Prepare(Good(), &buffers);
  ASSERT_TRUE(inline_job.ok()) << inline_job.status();
  EXPECT_FALSE(inline_job->device.has_value());
  absl::StatusOr<ScoreJob> on_0 = Prepare(DeviceRequest(3), &buffers);
  ASSERT_TRUE(on_0.ok()) << on_0.status();
  EXPECT_EQ(on_0->device, 0);
  v1::ScoreRequest all_on_1 = DeviceRequest(3);
  all_on_1.mutable_activations()->mutable_buffer()->set_buffer_id(11);
  all_on_1.mutable_device_rows()->mutable_buffer()->set_buffer_id(11);
  all_on_1.mutable_output()->mutable_buffer()->set_buffer_id(11);
  all_on_1.set_done_event(10);
  absl::StatusOr<ScoreJob> on_1 = Prepare(all_on_1, &buffers);
  ASSERT_TRUE(on_1.ok()) << on_1.status();
  EXPECT_EQ(on_1->device, 1);

  struct Case {
    std::function<void(v1::ScoreRequest&)> mutate;
    const char* fragment;
  };
  for (const Case& c : std::vector<Case>{
           {[](auto& r) { r.mutable_output()->mutable_buffer()->set_buffer_id(11); },
            "activations is on CUDA device 0 and output on device 1"},
           {[](auto& r) { r.mutable_device_rows()->mutable_buffer()->set_buffer_id(11); },
            "activations is on CUDA device 0 and device_rows on device 1"},
           {[](auto& r) { r.set_ready_event(10); },
            "activations is on CUDA device 0 and ready_event on device 1"},
           {[](auto& r) {
              r.mutable_activations()->mutable_buffer()->set_buffer_id(11);
              r.mutable_device_rows()->mutable_buffer()->set_buffer_id(11);
              r.set_done_event(6);
            },
            "activations is on CUDA device 1 and output on device 0"},
       }) {
    v1::ScoreRequest r = DeviceRequest(3);
    c.mutate(r);
    absl::StatusOr<ScoreJob> job = Prepare(r, &buffers);
    ASSERT_FALSE(job.ok()) << c.fragment;
    EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(job.status().message().find(c.fragment), absl::string_view::npos)
        << job.status().message();
    EXPECT_NE(job.status().message().find("a request runs on one device"), absl::string_view::npos);
  }
}

TEST_F(ScoreJobTest, DeviceRowAndEventRefusals) {
  struct Case {
    std::function<void(v1::ScoreRequest&)> mutate;
    absl::StatusCode code;
    const char* fragment;
  };
  const std::vector<Case> cases = {
      {[](auto& r) { r.add_rows(0); }, absl::StatusCode::kInvalidArgument, "not both"},
      {[](auto& r) { r.mutable_device_rows()->set_dtype(v1::DTYPE_FLOAT32); },
       absl::StatusCode::kInvalidArgument, "dtype must be DTYPE_INT32"},
      {[](auto& r) { r.mutable_device_rows()->add_shape(1); }, absl::StatusCode::kInvalidArgument,
       "1-D shape"},
      {[](auto& r) { r.mutable_device_rows()->set_shape(0, 0); },
       absl::StatusCode::kInvalidArgument, "at least one row"},
      {[](auto& r) { r.mutable_device_rows()->set_shape(0, 101); },
       absl::StatusCode::kResourceExhausted, "--max-rows"},
      {[](auto& r) { r.mutable_device_rows()->set_row_stride(2); },
       absl::StatusCode::kInvalidArgument, "contiguous"},
      {[](auto& r) { r.mutable_device_rows()->set_data("abcd"); },
       absl::StatusCode::kInvalidArgument, "must name a registered buffer"},
      // The rows buffer is too small for R rows: 4096 - 4 leaves room for one int32.
      {[](auto& r) { r.mutable_device_rows()->mutable_buffer()->set_offset_bytes(4096 - 4); },
       absl::StatusCode::kInvalidArgument, "device_rows: past the end"},
      {[](auto& r) { r.mutable_device_rows()->mutable_buffer()->set_offset_bytes(2); },
       absl::StatusCode::kInvalidArgument, "misaligned for int32"},
      {[](auto& r) { r.mutable_device_rows()->mutable_buffer()->set_buffer_id(9); },
       absl::StatusCode::kNotFound, "device_rows: buffer is not registered"},
      {[](auto& r) {
         r.mutable_activations()->clear_buffer();
         r.mutable_activations()->set_data(Floats(4 * kHidden));
       },
       absl::StatusCode::kInvalidArgument, "need activations in a registered buffer"},
      // The buffers belong to session 1: another session (or none) may not name them.
      {[](auto& r) { r.set_session_id(0); }, absl::StatusCode::kPermissionDenied,
       "activations: belongs to another session"},
      {[](auto& r) { r.set_session_id(2); }, absl::StatusCode::kPermissionDenied,
       "activations: belongs to another session"},
      {[](auto& r) {
         r.set_session_id(1);
         r.set_ready_event(99);
       },
       absl::StatusCode::kNotFound, "ready_event: event is not registered"},
      {[](auto& r) {
         r.set_session_id(1);
         r.set_done_event(8);
       },
       absl::StatusCode::kPermissionDenied, "done_event: belongs to another session"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    FakeBuffers buffers;
    v1::ScoreRequest r = DeviceRequest(3);
    cases[i].mutate(r);
    absl::StatusOr<ScoreJob> job = Prepare(r, &buffers);
    ASSERT_FALSE(job.ok()) << i;
    EXPECT_EQ(job.status().code(), cases[i].code) << i << ": " << job.status();
    EXPECT_NE(job.status().message().find(cases[i].fragment), absl::string_view::npos)
        << i << ": " << job.status();
  }
  // Events without a session.
  {
    FakeBuffers buffers;
    v1::ScoreRequest r = Good();
    r.set_ready_event(5);
    absl::StatusOr<ScoreJob> job = Prepare(r, &buffers);
    EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(job.status().message().find("ready_event: events belong to a session"),
              absl::string_view::npos);
  }
  // Events on a backend without IPC.
  v1::ScoreRequest r = Good();
  r.set_session_id(1);
  r.set_done_event(6);
  EXPECT_EQ(Prepare(r).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace probesidecar::server
