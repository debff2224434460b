// The test-only fault injector: requests number N, 2N, ... fail with INTERNAL as a failed CUDA call
// would, the others (and failures of the executor itself) pass through; it is off unless
// PROBE_SIDECAR_TEST_FAULT_EVERY is a positive integer.
#include "tests/faults/fault_injection.h"

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/executors/test_executor.h"

namespace probesidecar::server {
namespace {

// Answers every request at once with `status`.
class AnsweringExecutor final : public TestExecutor {
 public:
  explicit AnsweringExecutor(absl::Status status) : status_(std::move(status)) {}
  void Submit(ExecutorTask task) override { Refuse(std::move(task), status_); }

 private:
  const absl::Status status_;
};

TEST(FaultInjectionTest, EveryNthRequestFailsWithInternal) {
  std::unique_ptr<Executor> executor =
      InjectFaults(std::make_unique<AnsweringExecutor>(absl::OkStatus()), 3);
  std::vector<absl::Status> answers;
  for (int i = 0; i < 8; ++i) {  // Score and Verify, counted together
    if (i % 2 == 0) {
      executor->Score(std::make_unique<ScoreJob>(),
                      [&](std::unique_ptr<ScoreJob> job, absl::Status s, const ScoreTimings&) {
                        EXPECT_NE(job, nullptr);  // handed back with the answer
                        answers.push_back(s);
                      });
    } else {
      executor->Verify(std::make_unique<VerifyJob>(),
                       [&](std::unique_ptr<VerifyJob> job, absl::Status s, const VerifyResult&) {
                         EXPECT_NE(job, nullptr);
                         answers.push_back(s);
                       });
    }
  }
  ASSERT_EQ(answers.size(), 8u);
  for (int i = 0; i < 8; ++i) {
    if ((i + 1) % 3 == 0) {
      EXPECT_EQ(answers[i].code(), absl::StatusCode::kInternal) << i;
      EXPECT_NE(answers[i].message().find("test-only"), absl::string_view::npos);
    } else {
      EXPECT_TRUE(answers[i].ok()) << i << ": " << answers[i];
    }
  }
}

TEST(FaultInjectionTest, TheExecutorsOwnFailuresPassThrough) {
  std::unique_ptr<Executor> executor = InjectFaults(
      std::make_unique<AnsweringExecutor>(absl::ResourceExhaustedError("queue full")), 1);
  absl::Status answer;
  executor->Score(std::make_unique<ScoreJob>(), [&](std::unique_ptr<ScoreJob>, absl::Status s,
                                                    const ScoreTimings&) { answer = s; });
  EXPECT_EQ(answer.code(), absl::StatusCode::kResourceExhausted);
}

TEST(FaultInjectionTest, TheInnerExecutorsFatalErrorReachesTheHandler) {
  auto inner = std::make_unique<AnsweringExecutor>(absl::OkStatus());
  AnsweringExecutor* raw = inner.get();
  std::unique_ptr<Executor> executor = InjectFaults(std::move(inner), 5);
  std::vector<std::string> reasons;
  executor->SetFatalHandler(
      [&](const absl::Status& why) { reasons.push_back(std::string(why.message())); });
  raw->ReportFatal(absl::UnavailableError("the GPU's CUDA context is lost"));
  ASSERT_EQ(reasons.size(), 1u);
  EXPECT_EQ(reasons[0], "the GPU's CUDA context is lost");
  EXPECT_EQ(executor->info().backend, "test");  // everything else passes through
}

TEST(FaultInjectionTest, OffUnlessTheVariableIsAPositiveInteger) {
  unsetenv(kFaultEveryEnv);
  EXPECT_EQ(FaultEveryFromEnvironment(), 0u);
  for (const char* off : {"", "0", "x", "-3", "2.5"}) {
    setenv(kFaultEveryEnv, off, 1);
    EXPECT_EQ(FaultEveryFromEnvironment(), 0u) << off;
  }
  setenv(kFaultEveryEnv, "4", 1);
  EXPECT_EQ(FaultEveryFromEnvironment(), 4u);
  unsetenv(kFaultEveryEnv);
}

}  // namespace
}  // namespace probesidecar::server
