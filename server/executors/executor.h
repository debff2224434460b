// The executor interface: where Score requests run (the CPU's threads, or a GPU's stream slots).
//
// Threading contract: Submit and Warmup never block the caller — they queue the work and return;
// the completion callback runs exactly once, on one of the executor's own threads (or on the
// caller's thread when the work is refused at once). ReadStats waits only when asked to
// (OutcomeCopy::kWait: the metrics scrape's thread, never a gRPC thread).
//
// Lifetime: a job whose RequestLifetime has ended when a worker takes it (deadline passed, caller
// gone) is not run, and answers DEADLINE_EXCEEDED or CANCELLED; the CPU backend also checks
// between the tasks of a running job and stops it early. Place may wait for the device (it uploads
// weights): callers run it on a thread of their own, never on a gRPC thread.
//
// The seam is narrow on purpose (seven methods beside the destructor): what an executor is
// (info), placing a probe set (Place, then Warmup once it is published), submitting a task (a
// Score or a Verify), what it reports (ReadStats, OutcomeCounts) and stopping (ShutdownBy). What
// every backend shares (the fatal handler, the Score/Verify spellings of Submit) is the base's.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kernels/probe_outcomes/probe_outcomes.h"
#include "server/observability/executor_stats.h"
#include "server/observability/stage_timings.h"
#include "server/probes/probe_set.h"
#include "server/requests/score_job.h"
#include "server/requests/verify_job.h"

namespace probesidecar::server {

// A job is owned by the executor from Submit until its completion callback, which gets it back:
// releasing the job releases its leases (buffers, events, the probe set).
using ScoreDone = absl::AnyInvocable<void(std::unique_ptr<ScoreJob> job, absl::Status status,
                                          const ScoreTimings& timings) &&>;
using WarmupDone = absl::AnyInvocable<void(absl::Status status) &&>;

// How a Verify went.
struct VerifyResult {
  const char* kernel_path = "";
  double queue_seconds = 0;  // waiting for a worker
  // Shadow mode: ours against the caller's output.
  bool shadow = false;
  double max_abs_error = 0;
  double rel_l2_error = 0;
  uint64_t compared = 0;
  uint64_t mismatched = 0;
};
using VerifyDone = absl::AnyInvocable<void(std::unique_ptr<VerifyJob> job, absl::Status status,
                                           const VerifyResult& result) &&>;

// The work an executor takes: a Score (probe scoring) or a Verify (MLA verify attention, the CUDA
// backend's), each with the callback its answer goes to.
struct ScoreTask {
  std::unique_ptr<ScoreJob> job;
  ScoreDone done;
};
struct VerifyTask {
  std::unique_ptr<VerifyJob> job;
  VerifyDone done;
};
using ExecutorTask = std::variant<ScoreTask, VerifyTask>;

// Answers `task` with `status` (and empty timings or result) without running it: a refusal.
void Refuse(ExecutorTask task, absl::Status status);

// Passes the status `task` is answered with through `through` (absl::Status -> absl::Status)
// before its callback gets it: e.g. to note the answer, or to replace it.
template <typename Through>
void AnswerThrough(ExecutorTask& task, Through through) {
  std::visit(
      [&through](auto& t) {
        using Done = decltype(t.done);
        t.done = Done([done = std::move(t.done), through = std::move(through)](
                          auto job, absl::Status status, const auto& result) mutable {
          std::move(done)(std::move(job), through(std::move(status)), result);
        });
      },
      task);
}

// `parts` callbacks that together answer `done` once, when the last of them is called (from any
// thread), with the first failure among their statuses (OK when none failed): a warm-up made of
// several (each stream slot's, each device's).
std::vector<WarmupDone> SplitWarmupDone(WarmupDone done, int parts);

// What an executor is, fixed once it has started.
struct ExecutorInfo {
  std::string backend;      // "cpu" or "cuda"
  std::string device_name;  // for ServerInfo and the log
  // The CUDA devices it serves, on which clients may register IPC buffers and events; empty when
  // the backend has none (the CPU backend: inline tensors only).
  std::vector<int> devices;
  // The device's compute capability, "major.minor" (empty on the CPU backend), and the kernel
  // paths this build runs on it (ServerInfo).
  std::string compute_capability;
  std::vector<std::string> kernel_paths;
};

// How fresh the probe-outcome counts read after a ReadStats call are. The CUDA backend copies the
// counters from each device on its monitor thread (one copy per set and label slot in use, then
// one wait); the CPU backend counts on the host and has nothing to copy.
enum class OutcomeCopy {
  kNone,  // as of the last copy
  kAsk,   // ask for a copy without waiting (ServerInfo and ListProbeSets, on gRPC threads: what
          // they read is the previous copy, the next read sees this one)
  kWait,  // ask and wait for it until StatsRead::wait_until at most (a device that does not
          // answer keeps its previous copy): the metrics scrape, never a gRPC thread
};
struct StatsRead {
  OutcomeCopy outcome_copy = OutcomeCopy::kNone;
  absl::Time wait_until = absl::InfinitePast();
};

class Executor {
 public:
  virtual ~Executor() = default;

  virtual const ExecutorInfo& info() const = 0;

  // Called once per probe set before it is published: attaches the executor's placement of it
  // (ProbeSet::placements: e.g. its device weights and outcome counters). May wait for the device.
  virtual absl::Status Place(ProbeSet& set) = 0;

  // Called once a probe set is published: captures its graphs for the configured row buckets on
  // every stream slot, then calls `done` (from any thread). Does not wait.
  virtual void Warmup(std::shared_ptr<const ProbeSet> set, WarmupDone done) = 0;

  // Takes the task, queues it and returns; its callback is called exactly once with the job,
  // from one of the executor's threads — or at once, with RESOURCE_EXHAUSTED (the queue is full)
  // or UNAVAILABLE (shut down). DEADLINE_EXCEEDED or CANCELLED: its lifetime ended first. A job
  // runs on its device (job->device: that of its buffers; a Score of inline tensors: any device).
  // A backend without Verify answers it FAILED_PRECONDITION.
  virtual void Submit(ExecutorTask task) = 0;

  // What it reports of itself (ServerInfo, metrics scrapes): readable from any thread at any time
  // without waiting, except for the outcome copy `read` waits for.
  virtual ExecutorStats ReadStats(const StatsRead& read) = 0;

  // What the probes of `set` found, per label slot (ScoreJob::outcome_slot), summed over the
  // served devices: on the CPU backend as counted so far, on the CUDA backend as of the last copy
  // from the devices (ReadStats' outcome_copy). Readable from any thread without waiting.
  virtual kernels::ProbeOutcomeCounts OutcomeCounts(const ProbeSet& set) const = 0;

  // Finishes queued work and stops the threads, waiting for the device until `deadline` at most:
  // false when work was still pending there (a stream waiting for a client's event that never
  // came, or a lost context). The device resources are then left to the process's exit, which
  // must not wait for the device either (RunServer ends the process without the CUDA runtime's
  // teardown). No task after this.
  virtual bool ShutdownBy(absl::Time deadline) = 0;

  // ---- Shared by every backend ----------------------------------------------------------------

  void Score(std::unique_ptr<ScoreJob> job, ScoreDone done) {
    Submit(ScoreTask{std::move(job), std::move(done)});
  }
  void Verify(std::unique_ptr<VerifyJob> job, VerifyDone done) {
    Submit(VerifyTask{std::move(job), std::move(done)});
  }
  ExecutorStats stats() { return ReadStats({}); }
  // ShutdownBy with a grace of kShutdownGrace for the device.
  static constexpr absl::Duration kShutdownGrace = absl::Seconds(5);
  void Shutdown() { ShutdownBy(absl::Now() + kShutdownGrace); }

  // `handler` is called once, from any thread, when the executor can no longer serve at all
  // (the GPU's CUDA context is lost after a sticky error); requests then fail with UNAVAILABLE.
  // Set before serving; an empty handler removes it.
  using FatalHandler = absl::AnyInvocable<void(const absl::Status& why)>;
  void SetFatalHandler(FatalHandler handler);

 protected:
  // Calls the fatal handler (once: it is dropped after) with `why`; nothing when none is set.
  void ReportFatal(const absl::Status& why);

 private:
  absl::Mutex fatal_mu_;
  FatalHandler fatal_handler_ ABSL_GUARDED_BY(fatal_mu_);
};

}  // namespace probesidecar::server
