// The service with an executor that holds every Score: gRPC's callback threads must hand work
// off and return, so ServerInfo and health answer (each within its deadline) while every request
// waits, and the held requests still complete once the executor lets them go.
#include "server/rpc/service.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/safetensors.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "probesidecar/v1/sidecar.grpc.pb.h"
#include "server/executors/test_executor.h"

namespace probesidecar::server {
namespace {

constexpr int kHidden = 8;
constexpr int kProbes = 2;

// Queues every Score and completes none until Release(): the slowest possible executor that
// still keeps the threading contract (Score returns at once).
class HoldingExecutor final : public TestExecutor {
 public:
  HoldingExecutor() : TestExecutor({"cpu", "holding (test)", {}, "", {}}) {}
  void Submit(ExecutorTask task) override {
    auto& score = std::get<ScoreTask>(task);
    absl::MutexLock lock(&mu_);
    held_.push_back({std::move(score.job), std::move(score.done)});
  }
  // True once `n` requests are held; false if they are not within `timeout`.
  [[nodiscard]] bool AwaitHeld(int n, absl::Duration timeout = absl::Seconds(30)) {
    absl::MutexLock lock(&mu_);
    auto held = [this, n] {
      mu_.AssertReaderHeld();
      return static_cast<int>(held_.size()) >= n;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&held), timeout);
  }
  // Completes every held request, from a thread of its own (as an executor's worker would).
  void Release() {
    std::vector<Held> done;
    {
      absl::MutexLock lock(&mu_);
      done.swap(held_);
    }
    std::thread([done = std::move(done)]() mutable {
      for (Held& d : done) std::move(d.done)(std::move(d.job), absl::OkStatus(), ScoreTimings{});
    }).join();
  }
 private:
  struct Held {
    std::unique_ptr<ScoreJob> job;
    ScoreDone done;
  };
  absl::Mutex mu_;
  std::vector<Held> held_ ABSL_GUARDED_BY(mu_);
};

std::string ProbeFile() {
  std::string weight(sizeof(float) * kProbes * kHidden, '\0');
  std::string bias(sizeof(float) * kProbes, '\0');
  for (int i = 0; i < kProbes * kHidden; ++i) {
    const float v = 0.01f * static_cast<float>(i);
    std::memcpy(weight.data() + sizeof(float) * i, &v, sizeof(v));
  }
  return common::WriteSafetensors(
      {{"weight", "F32", {kProbes, kHidden}, weight}, {"bias", "F32", {kProbes}, bias}}, {});
}

v1::ScoreRequest ScoreRequest() {
  v1::ScoreRequest request;
  request.set_probe_set("p");
  request.add_rows(0);
  v1::TensorRef* x = request.mutable_activations();
  x->set_dtype(v1::DTYPE_FLOAT32);
  x->add_shape(1);
  x->add_shape(kHidden);
  x->set_data(std::string(sizeof(float) * kHidden, '\0'));
  return request;
}

class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    socket_ = absl::StrCat(::testing::TempDir(), "/service_test_", ::getpid(), ".sock");
    std::remove(socket_.c_str());
    probes_ = std::make_unique<ProbeRegistry>("", ProbeSetLimits{},
                                              [](ProbeSet&) { return absl::OkStatus(); });
    ASSERT_TRUE(probes_->LoadFromBytes("p", ProbeFile(), false).ok());
    metrics_ = std::make_unique<Metrics>(BuildInfo{}, [] { return MetricsState{}; });
    ServiceEnv env;
    env.config.max_concurrent_requests = 1024;
    env.probes = probes_.get();
    env.executor = &executor_;
    env.sessions = &sessions_;
    env.outcome_labels = &outcome_labels_;
    env.metrics = metrics_.get();
    // The Unix socket is the service's own, as in the server: its peer (this process, the same
    // uid) is then admin without a credential.
    env.unix_peers = &unix_peers_;
    env.server_uid = ::geteuid();
    service_ = std::make_unique<ProbeSidecarService>(env);
    absl::StatusOr<std::unique_ptr<UnixListener>> listener = UnixListener::Listen(socket_, 0600);
    ASSERT_TRUE(listener.ok()) << listener.status();
    listener_ = *std::move(listener);
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    listener_->Start(server_.get(), &unix_peers_);
    channel_ = grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials());
  }

  void TearDown() override {
    executor_.Release();
    for (std::thread& t : clients_) t.join();
    if (listener_ != nullptr) listener_->Stop();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    server_->Wait();
    service_->StopControlWorker();
    std::remove(socket_.c_str());
  }

  std::string socket_;
  HoldingExecutor executor_;
  std::unique_ptr<ProbeRegistry> probes_;
  std::unique_ptr<Metrics> metrics_;
  SessionTable sessions_;
  OutcomeLabels outcome_labels_{{"model"}, 4};
  UnixPeers unix_peers_;
  std::unique_ptr<UnixListener> listener_;
  std::unique_ptr<ProbeSidecarService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::ProbeSidecar::Stub> stub_;
  std::vector<std::thread> clients_;  // joined in TearDown, also when a test stops early
};

TEST_F(ServiceTest, ServerInfoAndHealthStayFastWhileEveryScoreWaits) {
  constexpr int kRequests = 64;
  stub_ = v1::ProbeSidecar::NewStub(channel_);
  auto* stub = stub_.get();
  // Many concurrent Score calls, each on its own client thread; the executor holds them all.
  auto ok = std::make_shared<std::atomic<int>>(0);
  for (int i = 0; i < kRequests; ++i) {
    clients_.emplace_back([stub, ok] {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      v1::ScoreResponse response;
      if (stub->Score(&context, ScoreRequest(), &response).ok()) ok->fetch_add(1);
    });
  }
  ASSERT_TRUE(executor_.AwaitHeld(kRequests)) << "not every Score reached the executor";

  // Every request is in progress; the server must still answer everything else, each within its
  // deadline (a gRPC thread that waited for the held work would wait until Release).
  auto health = grpc::health::v1::Health::NewStub(channel_);
  for (int i = 0; i < 20; ++i) {
    {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      v1::ServerInfoResponse info;
      ASSERT_TRUE(stub->ServerInfo(&context, v1::ServerInfoRequest(), &info).ok());
      EXPECT_EQ(info.probe_sets_size(), 1);
    }
    {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      grpc::health::v1::HealthCheckResponse reply;
      ASSERT_TRUE(health->Check(&context, grpc::health::v1::HealthCheckRequest(), &reply).ok());
    }
  }
  EXPECT_EQ(ok->load(), 0);

  executor_.Release();
  for (std::thread& t : clients_) t.join();
  clients_.clear();
  EXPECT_EQ(ok->load(), kRequests);
}

// LoadProbeSet takes a precision (or the default rule), refuses a value outside the enum before
// doing anything, and the set's resolved precision shows in ListProbeSets and in its scores.
TEST_F(ServiceTest, ProbeSetPrecisionIsChosenAtLoadAndReported) {
  stub_ = v1::ProbeSidecar::NewStub(channel_);
  auto load = [&](const std::string& name, int precision, v1::LoadProbeSetResponse* response) {
    v1::LoadProbeSetRequest request;
    request.set_name(name);
    request.set_safetensors(ProbeFile());
    request.set_precision(static_cast<v1::Precision>(precision));
    grpc::ClientContext context;
    return stub_->LoadProbeSet(&context, request, response);
  };
  v1::LoadProbeSetResponse loaded;
  ASSERT_TRUE(load("f", v1::PRECISION_FAST, &loaded).ok());
  EXPECT_EQ(loaded.probe_set().precision(), v1::PRECISION_FAST);
  ASSERT_TRUE(load("e", v1::PRECISION_EXACT, &loaded).ok());
  EXPECT_EQ(loaded.probe_set().precision(), v1::PRECISION_EXACT);
  ASSERT_TRUE(load("d", v1::PRECISION_UNSPECIFIED, &loaded).ok());
  EXPECT_EQ(loaded.probe_set().precision(), v1::PRECISION_EXACT);  // P = 2: exact by default
  for (int bad : {3, -1, 1000}) {
    const grpc::Status status = load("bad", bad, &loaded);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad;
    EXPECT_NE(status.error_message().find(absl::StrCat("precision ", bad, " is not a Precision")),
              std::string::npos)
        << status.error_message();
  }
  EXPECT_EQ(probes_->Find("bad"), nullptr);

  v1::ListProbeSetsResponse list;
  grpc::ClientContext list_context;
  ASSERT_TRUE(stub_->ListProbeSets(&list_context, v1::ListProbeSetsRequest(), &list).ok());
  std::map<std::string, v1::Precision> listed;
  for (const v1::ProbeSetInfo& info : list.probe_sets()) listed[info.name()] = info.precision();
  EXPECT_EQ(listed, (std::map<std::string, v1::Precision>{{"d", v1::PRECISION_EXACT},
                                                          {"e", v1::PRECISION_EXACT},
                                                          {"f", v1::PRECISION_FAST},
                                                          {"p", v1::PRECISION_EXACT}}));

  // A score carries the precision of the set that computed it.
  v1::ScoreRequest request = ScoreRequest();
  request.set_probe_set("f");
  v1::ScoreResponse response;
  grpc::Status status;
  clients_.emplace_back([&] {
    grpc::ClientContext context;
    status = stub_->Score(&context, request, &response);
  });
  ASSERT_TRUE(executor_.AwaitHeld(1)) << "the Score did not reach the executor";
  executor_.Release();
  clients_.back().join();
  clients_.pop_back();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.precision(), v1::PRECISION_FAST);
}

}  // namespace
}  // namespace probesidecar::server
