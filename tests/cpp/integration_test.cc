// The C++ client against the real probe-sidecar binary (CPU backend).
#include <signal.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <thread>

#include "client/cpp/client.h"
#include "client/cpp/score_pipeline.h"
#include "client/cpp/tap.h"
#include "common/dtype.h"
#include "common/safetensors.h"
#include "gtest/gtest.h"
#include "kernels/probe_score/probe_score_ref.h"
#include "tests/cpp/sidecar_process.h"
#include "tests/cpp/wait_until.h"

namespace probesidecar {
namespace {

using client::Client;
using client::InlineTensor;

// A probe set file with random float32 weights; keeps the weights for the reference.
struct ProbeFile {
  int32_t num_probes;
  int32_t hidden;
  std::vector<float> weight;
  std::vector<float> bias;
  std::string bytes;
};

ProbeFile MakeProbeFile(int32_t num_probes, int32_t hidden, uint32_t seed, bool sigmoid) {
  ProbeFile f{num_probes, hidden, {}, {}, {}};
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < int64_t{num_probes} * hidden; ++i) {
    f.weight.push_back(normal(rng) / std::sqrt(static_cast<float>(hidden)));
  }
  for (int32_t p = 0; p < num_probes; ++p) f.bias.push_back(0.1f * normal(rng));
  std::map<std::string, std::string> metadata;
  if (sigmoid) metadata["activation"] = "sigmoid";
  f.bytes = common::WriteSafetensors(
      {{"weight",
        "F32",
        {num_probes, hidden},
        std::string(reinterpret_cast<const char*>(f.weight.data()), f.weight.size() * 4)},
       {"bias",
        "F32",
        {num_probes},
        std::string(reinterpret_cast<const char*>(f.bias.data()), f.bias.size() * 4)}},
      metadata);
  return f;
}

std::vector<double> Reference(const ProbeFile& f, const std::vector<uint16_t>& x_bits,
                              common::DType dtype, int64_t row_stride,
                              const std::vector<int32_t>& rows, bool sigmoid) {
  kernels::ProbeScoreCpuParams p;
  p.x = x_bits.data();
  p.x_dtype = dtype;
  p.x_row_stride = row_stride;
  p.rows = rows.data();
  p.num_rows = static_cast<int32_t>(rows.size());
  p.weight = f.weight.data();
  p.bias = f.bias.data();
  p.hidden = f.hidden;
  p.num_probes = f.num_probes;
  p.activation = sigmoid ? kernels::Activation::kSigmoid : kernels::Activation::kNone;
  std::vector<double> out(rows.size() * f.num_probes);
  kernels::ProbeScoreRefF64(p, out.data());
  return out;
}

double RelError(const std::vector<float>& out, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (out[i] - ref[i]) * (out[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

class IntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string error;
    ASSERT_TRUE(sidecar_.Start(&error)) << error;
  }
  testing::SidecarProcess sidecar_{{"--backend=cpu"}};
};

TEST_F(IntegrationTest, HealthInfoAndDemoSet) {
  for (const std::string& target : {sidecar_.uds_target(), sidecar_.tcp_target()}) {
    Client c(target);
    absl::StatusOr<std::string> health = c.Health();
    ASSERT_TRUE(health.ok()) << health.status();
    EXPECT_EQ(*health, "SERVING");
    absl::StatusOr<v1::ServerInfoResponse> info = c.ServerInfo();
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->backend(), "cpu");
    ASSERT_EQ(info->probe_sets_size(), 1);
    EXPECT_EQ(info->probe_sets(0).name(), "demo");
  }
}

TEST_F(IntegrationTest, ScoresMatchFloat64ReferenceInEveryDtype) {
  Client c(sidecar_.uds_target());
  const ProbeFile f = MakeProbeFile(7, 200, 1, /*sigmoid=*/false);
  // Exact: the reference multiplies the file's float32 weights (the default above 2 probes is
  // fast).
  ASSERT_TRUE(c.LoadProbeSetFromBytes("p7", f.bytes, {.precision = v1::PRECISION_EXACT}).ok());
  std::mt19937 rng(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (common::DType dtype :
       {common::DType::kFloat32, common::DType::kFloat16, common::DType::kBFloat16}) {
    const int64_t rows = 30, stride = 211;  // strided rows
    std::vector<uint16_t> halves((rows - 1) * stride + f.hidden + 1);
    std::vector<float> floats(halves.size());
    for (size_t i = 0; i < halves.size(); ++i) {
      floats[i] = normal(rng);
      halves[i] = dtype == common::DType::kFloat16 ? common::FloatToHalf(floats[i])
                                                   : common::FloatToBf16(floats[i]);
    }
    const size_t extent = (rows - 1) * stride + f.hidden;
    std::string bytes;
    v1::DType proto;
    std::vector<uint16_t> ref_input;  // float32 data travels as pairs of uint16 for the reference
    if (dtype == common::DType::kFloat32) {
      bytes.assign(reinterpret_cast<const char*>(floats.data()), extent * 4);
      ref_input.resize(extent * 2);
      std::memcpy(ref_input.data(), floats.data(), extent * 4);
      proto = v1::DTYPE_FLOAT32;
    } else {
      bytes.assign(reinterpret_cast<const char*>(halves.data()), extent * 2);
      ref_input.assign(halves.begin(), halves.begin() + extent);
      proto = dtype == common::DType::kFloat16 ? v1::DTYPE_FLOAT16 : v1::DTYPE_BFLOAT16;
    }
    const std::vector<int32_t> row_ids = {0, 29, 29, 5, 17};
    absl::StatusOr<client::ScoreResult> result =
        c.Score(InlineTensor(proto, rows, f.hidden, bytes, stride), row_ids, "p7");
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->kernel_path, "cpu");
    ASSERT_EQ(result->scores.size(), row_ids.size() * 7);
    const std::vector<double> ref = Reference(f, ref_input, dtype, stride, row_ids, false);
    EXPECT_LE(RelError(result->scores, ref), 1e-5) << common::DTypeName(dtype);
  }
}

TEST_F(IntegrationTest, BadInputsGetPreciseCodesAndTheServerKeepsServing) {
  Client c(sidecar_.uds_target());
  const ProbeFile f = MakeProbeFile(2, 16, 3, true);
  ASSERT_TRUE(c.LoadProbeSetFromBytes("p2", f.bytes).ok());
  const std::string ok_bytes(4 * 16 * 4, '\0');
  auto score = [&](v1::TensorRef t, std::vector<int32_t> rows, std::string set) {
    return c.Score(t, rows, set).status().code();
  };
  EXPECT_EQ(score(InlineTensor(v1::DTYPE_FLOAT32, 4, 16, ok_bytes), {4}, "p2"),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(score(InlineTensor(v1::DTYPE_FLOAT32, 4, 16, ok_bytes), {0}, "nope"),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(score(InlineTensor(v1::DTYPE_INT32, 4, 16, ok_bytes), {0}, "p2"),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(score(InlineTensor(v1::DTYPE_FLOAT32, 4, 8, ok_bytes), {0}, "p2"),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(score(InlineTensor(v1::DTYPE_FLOAT32, 4, 16, ok_bytes.substr(1)), {0}, "p2"),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.LoadProbeSetFromBytes("bad", "garbage").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.LoadProbeSetFromBytes("p2", f.bytes).status().code(),
            absl::StatusCode::kAlreadyExists);
  v1::RegisterBufferRequest reg;
  reg.set_handle(std::string(64, 'x'));
  EXPECT_EQ(c.RegisterBuffer(reg).status().code(), absl::StatusCode::kFailedPrecondition);
  // Still serving, and the set is unchanged.
  absl::StatusOr<client::ScoreResult> good =
      c.Score(InlineTensor(v1::DTYPE_FLOAT32, 4, 16, ok_bytes), {0, 3}, "p2");
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_NEAR(good->scores[0], 1.0 / (1.0 + std::exp(-f.bias[0])), 1e-6);
  EXPECT_TRUE(c.UnloadProbeSet("p2").ok());
  EXPECT_EQ(c.UnloadProbeSet("p2").code(), absl::StatusCode::kNotFound);
}

TEST_F(IntegrationTest, ScoreStreamAnswersInOrder) {
  Client c(sidecar_.uds_target());
  grpc::ClientContext context;
  auto stream = c.stub().ScoreStream(&context);
  const std::string bytes(2 * 4096 * 2, '\0');
  for (int i = 0; i < 20; ++i) {
    v1::ScoreRequest request;
    *request.mutable_activations() = InlineTensor(v1::DTYPE_BFLOAT16, 2, 4096, bytes);
    request.add_rows(i % 3 == 2 ? 7 : 1);  // every third is out of range
    request.set_probe_set("demo");
    request.set_request_id(i);
    ASSERT_TRUE(stream->Write(request));
    v1::ScoreResponse response;
    ASSERT_TRUE(stream->Read(&response));
    EXPECT_EQ(response.request_id(), static_cast<uint64_t>(i));
    if (i % 3 == 2) {
      EXPECT_EQ(response.error().code(), grpc::StatusCode::INVALID_ARGUMENT);
    } else {
      EXPECT_FALSE(response.has_error());
      EXPECT_EQ(response.scores().size(), 4u * 4);
    }
  }
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(IntegrationTest, ScorePipelineSubmitsWithoutWaitingAndResolvesInOrder) {
  Client c(sidecar_.uds_target());
  const std::string bytes(2 * 4096 * 2, '\0');
  std::vector<std::shared_future<absl::StatusOr<v1::ScoreResponse>>> answers;
  std::atomic<int> answered{0};
  {
    client::ScorePipeline pipeline(c);
    for (int i = 0; i < 100; ++i) {
      v1::ScoreRequest request;
      *request.mutable_activations() = InlineTensor(v1::DTYPE_BFLOAT16, 2, 4096, bytes);
      request.add_rows(i % 10 == 9 ? 7 : 1);  // every tenth is out of range
      request.set_probe_set("demo");
      request.set_request_id(i);
      answers.push_back(pipeline.Submit(request, [&answered] { answered.fetch_add(1); }));
    }
    for (int i = 0; i < 100; ++i) {
      const absl::StatusOr<v1::ScoreResponse>& answer = answers[i].get();
      if (i % 10 == 9) {
        EXPECT_EQ(answer.status().code(), absl::StatusCode::kInvalidArgument) << i;
      } else {
        ASSERT_TRUE(answer.ok()) << i << ": " << answer.status();
        EXPECT_EQ(answer->request_id(), static_cast<uint64_t>(i));
        EXPECT_EQ(answer->scores().size(), 4u * 4);
      }
    }
  }  // the pipeline closes its stream
  EXPECT_EQ(answered.load(), 100);
}

TEST_F(IntegrationTest, SigtermDuringTrafficExitsZero) {
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0}, unexpected{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      Client c(t % 2 ? sidecar_.uds_target() : sidecar_.tcp_target());
      const std::string bytes(8 * 4096 * 2, '\x01');
      while (!stop) {
        absl::StatusOr<client::ScoreResult> r =
            c.Score(InlineTensor(v1::DTYPE_BFLOAT16, 8, 4096, bytes), {0, 7}, "demo");
        if (r.ok()) {
          ++ok;
        } else {
          if (r.status().code() != absl::StatusCode::kUnavailable) ++unexpected;
          return;
        }
      }
    });
  }
  // Traffic is flowing: answers have come back before the signal.
  const bool flowing = WaitUntil([&] { return ok.load() >= 8; });
  EXPECT_TRUE(flowing) << "only " << ok.load() << " answers in 30 s";
  EXPECT_EQ(sidecar_.Stop(SIGTERM), 0) << sidecar_.Log();
  stop = true;
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(unexpected.load(), 0);
}

// What Tap::Create refuses from the server's answers alone, before it touches a GPU (the CUDA tap
// itself: tap_gpu_test.cc).
TEST_F(IntegrationTest, TapCreateRefusesMisuseBeforeAnyCudaWork) {
  Client c(sidecar_.uds_target());
  const uint64_t session = 7;  // never used: sessions need the CUDA backend, refusals come first
  client::TapOptions options;
  options.max_batch = 4;
  options.window = 4;
  auto create = [&](const client::TapOptions& o, const std::string& set, uint64_t id) {
    return client::Tap::Create(c, id, set, o).status();
  };
  EXPECT_EQ(create(options, "demo", 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(create(options, "no_such_set", session).code(), absl::StatusCode::kNotFound);
  client::TapOptions bad = options;
  bad.hidden_size = 100;
  absl::Status s = create(bad, "demo", session);
  EXPECT_NE(s.message().find("does not match probe set 'demo' (H = 4096)"), std::string::npos) << s;
  bad = options;
  bad.max_batch = bad.window = 1 << 12;  // past the server's --max-rows (65536 by default)
  s = create(bad, "demo", session);
  EXPECT_NE(s.message().find("more than the server's --max-rows (65536)"), std::string::npos) << s;
  bad = options;
  bad.dtype = v1::DTYPE_INT32;
  s = create(bad, "demo", session);
  EXPECT_NE(s.message().find("dtype"), std::string::npos) << s;
}

}  // namespace
}  // namespace probesidecar
