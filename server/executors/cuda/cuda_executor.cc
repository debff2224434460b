#include "server/executors/cuda/cuda_executor.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "kernels/blocks/device_support.h"
#include "kernels/blocks/tensor_map.h"
#include "kernels/probe_score/probe_score.h"
#include "server/executors/cuda/cuda_status.h"
#include "server/executors/cuda/device_coverage.h"
#include "server/executors/cuda/device_outcome_counters.h"
#include "server/executors/cuda/score_fault_hook.h"
#include "server/executors/cuda/score_runner.h"
#include "server/executors/cuda/stream_slot.h"
#include "server/executors/cuda/verify_runner.h"
#include "server/executors/drop_counter.h"
#include "server/executors/worker_pool.h"
#include "server/observability/log.h"
#include "server/observability/outcome_labels.h"

namespace probesidecar::server {
namespace {

using Clock = std::chrono::steady_clock;

// A parked slot is logged about once it has waited this long.
constexpr double kParkedWarnSeconds = 1.0;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The bytes of device memory the executor holds, and where the weights of a probe set are freed;
// shared with every set's weights, which can outlive the executor. cudaFree waits for the device,
// and the last reference to a probe set can drop anywhere (a gRPC thread that listed the sets,
// say), so the free is handed to a worker thread while the executor runs; once it has stopped,
// whoever drops the reference frees.
struct DeviceMemoryLedger {
  std::atomic<int64_t> device_bytes{0};
  absl::Mutex mu;
  WorkerPool* pool ABSL_GUARDED_BY(mu) = nullptr;
  // Set when the executor stopped with work still pending on the device (or its context lost):
  // freeing then could wait for that work (cudaFree synchronizes), so the memory is left to the
  // process's exit.
  bool abandoned ABSL_GUARDED_BY(mu) = false;

  void Free(absl::AnyInvocable<void() &&> free) {
    absl::MutexLock lock(&mu);
    if (abandoned) return;
    if (pool == nullptr) {
      std::move(free)();
      return;
    }
    // Worker 0 runs it before its next request; refused (shutting down): runs here, now.
    pool->SubmitTo(0, [free = std::move(free)](int) mutable { std::move(free)(); });
  }
};

// Whether contexts on `device` are shared through an MPS control daemon, as the driver reports it
// (CU_DEVICE_ATTRIBUTE_MPS_ENABLED). Read through the runtime's driver entry points, so that the
// binary needs no link-time libcuda.
absl::StatusOr<bool> MpsEnabled(int device) {
  void* get_device = nullptr;
  void* get_attribute = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion("cuDeviceGet", &get_device, 12000, cudaEnableDefault,
                                       &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess ||
      cudaGetDriverEntryPointByVersion("cuDeviceGetAttribute", &get_attribute, 12000,
                                       cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    return absl::UnavailableError("the driver does not expose cuDeviceGetAttribute");
  }
  CUdevice handle = 0;
  int enabled = 0;
  if (reinterpret_cast<PFN_cuDeviceGet_v2000>(get_device)(&handle, device) != CUDA_SUCCESS ||
      reinterpret_cast<PFN_cuDeviceGetAttribute_v2000>(get_attribute)(
          &enabled, CU_DEVICE_ATTRIBUTE_MPS_ENABLED, handle) != CUDA_SUCCESS) {
    return absl::UnavailableError("cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_MPS_ENABLED) failed");
  }
  return enabled != 0;
}

// One worker thread's share of the executor: its stream slot and the two kinds of request that
// run on it. (Members are destroyed in reverse: the runners before the slot whose stream they use.)
struct Worker {
  std::unique_ptr<StreamSlot> slot;
  std::unique_ptr<ScoreRunner> score;
  std::unique_ptr<VerifyRunner> verify;
};

// What a request kind brings to the executor's one task (CudaExecutor::GpuTask): its job, its
// outcome and callback, how it runs on a worker, and where its queue time goes.
struct ScoreRequest {
  using Job = ScoreJob;
  using Outcome = ScoreTimings;
  using Done = ScoreDone;
  static constexpr const char* kName = "Score";
  static double& QueueSeconds(Outcome& timings) { return timings.queue; }
  // TEST-ONLY (score_fault_hook.h): the fault this request enqueues once its client's event has
  // completed, if any.
  FaultLaunch fault = nullptr;
  absl::Status Run(Worker& worker, const Job& job, Outcome* timings) const {
    if (fault == nullptr) return worker.score->Run(job, timings, &timings->enqueued);
    worker.slot->ArmFault(fault);
    absl::Status status = worker.score->Run(job, timings, &timings->enqueued);
    worker.slot->ArmFault(nullptr);  // this request's only: unused where it ended early
    return status;
  }
  static bool Enqueued(const Outcome& timings) { return timings.enqueued; }
};

struct VerifyRequest {
  using Job = VerifyJob;
  using Outcome = VerifyOutcome;
  using Done = VerifyDone;
  static constexpr const char* kName = "Verify";
  static double& QueueSeconds(Outcome& outcome) { return outcome.queue_seconds; }
  absl::Status Run(Worker& worker, const Job& job, Outcome* outcome) const {
    return worker.verify->Run(job, outcome);
  }
  static bool Enqueued(const Outcome&) { return false; }
};

class CudaExecutor final : public Executor {
 public:
  CudaExecutor(const Config& config, std::string device_name, std::string compute_capability,
               std::vector<std::string> kernel_paths, bool mps)
      : config_(config),
        device_name_(std::move(device_name)),
        compute_capability_(std::move(compute_capability)),
        kernel_paths_(std::move(kernel_paths)),
        mps_(mps),
        ledger_(std::make_shared<DeviceMemoryLedger>()) {}

  ~CudaExecutor() override { Shutdown(); }

  absl::Status Init() {
    fault_hook_ = InstalledScoreFaultHook();
    PS_RETURN_IF_CUDA(cudaSetDevice(config_.device));
    PS_RETURN_IF_CUDA(cudaEventCreateWithFlags(&probe_event_, cudaEventDisableTiming));
    PS_RETURN_IF_CUDA(cudaStreamCreateWithFlags(&probe_stream_, cudaStreamNonBlocking));
    // One worker thread per stream slot, fed from one queue of --max-queued-requests.
    pool_ = std::make_unique<WorkerPool>(static_cast<int>(config_.cuda_workers),
                                         config_.max_queued_requests);
    for (uint32_t i = 0; i < config_.cuda_workers; ++i) {
      // When the GPU finishes work answered before it ran (enqueue-only, or given up at a
      // deadline), the slot's worker releases what it held and, if the slot was parked, takes
      // requests again (the nudge comes from CUDA's callback thread, which may only queue work).
      auto nudge = [this, worker = static_cast<int>(i)] {
        pool_->SubmitTo(worker, [this](int w) {
          if (w == WorkerPool::kRefused) return;
          workers_[w].slot->DrainCompleted();
          MaybeUnpark(w);
        });
      };
      Worker& worker = workers_.emplace_back();
      worker.slot = std::make_unique<StreamSlot>(config_.device, std::move(nudge), &stopping_);
      if (absl::Status s = worker.slot->Init(); !s.ok()) return s;
      worker.score =
          std::make_unique<ScoreRunner>(worker.slot.get(), config_, &ledger_->device_bytes);
      if (absl::Status s = worker.score->Init(config_); !s.ok()) return s;
      worker.verify = std::make_unique<VerifyRunner>(worker.slot.get(), &ledger_->device_bytes,
                                                     config_.graph_cache_entries);
    }
    {
      absl::MutexLock lock(&ledger_->mu);
      ledger_->pool = pool_.get();
    }
    monitor_ = std::thread([this] { Monitor(); });
    return absl::OkStatus();
  }

  const char* backend() const override { return "cuda"; }
  std::string device_name() const override { return device_name_; }
  std::string compute_capability() const override { return compute_capability_; }
  std::vector<std::string> kernel_paths() const override { return kernel_paths_; }
  std::vector<int> devices() const override { return {config_.device}; }

  uint64_t queued() const override { return pool_ != nullptr ? pool_->queued() : 0; }

  ExecutorStats stats() const override {
    ExecutorStats stats;
    stats.device_memory_bytes =
        static_cast<uint64_t>(std::max<int64_t>(0, ledger_->device_bytes.load()));
    stats.queued = queued();
    stats.queue_capacity = config_.max_queued_requests;
    stats.dropped = drops_.counts();
    stats.mps = mps_;
    stats.gpu_requests = gpu_requests_.load(std::memory_order_relaxed);
    for (const Worker& worker : workers_) {
      stats.invalid_device_rows += worker.score->invalid_rows();
      stats.non_finite_device_scores += worker.score->non_finite_scores();
      stats.parked_slots += worker.slot->parked() ? 1 : 0;
      stats.graph_cache += worker.score->counters();
      stats.invalid_verify_requests += worker.verify->invalid_requests();
    }
    DeviceReport& report = stats.devices.emplace_back();
    report.device = config_.device;
    report.name = device_name_;
    report.compute_capability = compute_capability_;
    report.kernel_paths = kernel_paths_;
    report.memory_bytes = stats.device_memory_bytes;
    report.queued = stats.queued;
    report.gpu_requests = stats.gpu_requests;
    report.parked_slots = stats.parked_slots;
    report.graph_cache = stats.graph_cache;
    if (lost_.load()) report.failure = std::string(LostStatus().message());
    return stats;
  }

  absl::Status PrepareProbeSet(ProbeSet& set) override {
    PS_RETURN_IF_CUDA(cudaSetDevice(config_.device));
    auto weights = std::make_unique<kernels::ProbeWeights>();
    if (cudaError_t e =
            kernels::CreateProbeWeights(set.weight.data(), set.bias.data(), set.num_probes,
                                        set.hidden, set.precision, weights.get());
        e != cudaSuccess) {
      return CudaStatus(e, absl::StrCat("uploading the weights of probe set '", set.name, "'"));
    }
    const int64_t bytes = static_cast<int64_t>(weights->storage_bytes);
    ledger_->device_bytes += bytes;
    const int device = config_.device;
    absl::StatusOr<std::unique_ptr<DeviceOutcomeCounters>> made = DeviceOutcomeCounters::Create(
        set, OutcomeLabels::SlotsFor(config_.max_session_label_sets), &ledger_->device_bytes);
    if (!made.ok()) {
      kernels::DestroyProbeWeights(weights.get());
      ledger_->device_bytes -= bytes;
      return absl::Status(made.status().code(),
                          absl::StrCat("probe set '", set.name, "': ", made.status().message()));
    }
    // Freed like the weights (cudaFree waits for the device): by a worker, once the set is gone.
    std::shared_ptr<DeviceOutcomeCounters> outcomes(
        made->release(), [device, ledger = ledger_](DeviceOutcomeCounters* counters) {
          ledger->Free([device, counters] {
            cudaSetDevice(device);
            delete counters;
          });
        });
    {
      absl::MutexLock lock(&outcomes_mu_);
      std::erase_if(outcomes_, [](const auto& weak) { return weak.expired(); });
      outcomes_.push_back(outcomes);
    }
    set.device_outcomes[device] = std::move(outcomes);
    set.device_weights[device] = std::shared_ptr<const void>(
        weights.release(), [device, bytes, ledger = ledger_](const void* p) {
          auto* w =
              const_cast<kernels::ProbeWeights*>(static_cast<const kernels::ProbeWeights*>(p));
          ledger->Free([device, bytes, w, ledger] {
            cudaSetDevice(device);
            kernels::DestroyProbeWeights(w);
            delete w;
            ledger->device_bytes -= bytes;
          });
        });
    return absl::OkStatus();
  }

  // Every stream slot captures the set's graphs for the configured row buckets, on its own
  // worker thread (ahead of its next request), so that the first requests replay.
  void Warmup(const std::shared_ptr<const ProbeSet>& set, WarmupDone done) override {
    struct Countdown {
      absl::Mutex mu;
      int remaining;
      absl::Status status;
      WarmupDone done;
    };
    if (workers_.empty()) {
      std::move(done)(absl::OkStatus());
      return;
    }
    auto countdown = std::make_shared<Countdown>();
    countdown->remaining = static_cast<int>(workers_.size());
    countdown->done = std::move(done);
    for (int i = 0; i < static_cast<int>(workers_.size()); ++i) {
      pool_->SubmitTo(i, [this, set, countdown](int worker) {
        // A parked slot (its stream still waits on the GPU) is skipped: it captures on first use.
        absl::Status status;
        if (worker == WorkerPool::kRefused) {
          status = absl::UnavailableError("the CUDA executor is shutting down");
        } else if (lost_.load()) {
          status = LostStatus();
        } else if (!workers_[worker].slot->parked() && workers_[worker].slot->Idle()) {
          status = WarmupWorker(*workers_[worker].score, set);
        }
        WarmupDone finished;
        {
          absl::MutexLock lock(&countdown->mu);
          if (countdown->status.ok()) countdown->status = status;
          if (--countdown->remaining == 0) finished = std::move(countdown->done);
        }
        if (finished) std::move(finished)(countdown->status);
      });
    }
  }

  void Score(std::unique_ptr<ScoreJob> job, ScoreDone done) override {
    if (lost_.load()) {
      std::move(done)(std::move(job), LostStatus(), ScoreTimings{});
      return;
    }
    ScoreRequest request;
    if (fault_hook_.at != 0 && score_requests_.fetch_add(1) + 1 == fault_hook_.at) {
      request.fault = fault_hook_.launch;
    }
    pool_->Submit(GpuTask(request, std::move(job), Clock::now(), std::move(done)));
  }

  void Verify(std::unique_ptr<VerifyJob> job, VerifyDone done) override {
    if (lost_.load()) {
      std::move(done)(std::move(job), LostStatus(), VerifyOutcome{});
      return;
    }
    pool_->Submit(GpuTask(VerifyRequest{}, std::move(job), Clock::now(), std::move(done)));
  }

  kernels::ProbeOutcomeCounts OutcomeCounts(const ProbeSet& set) const override {
    const auto it = set.device_outcomes.find(config_.device);
    if (it == set.device_outcomes.end() || it->second == nullptr) return {};
    return static_cast<const DeviceOutcomeCounters*>(it->second.get())->Read();
  }

  void RequestOutcomeRefresh() override {
    absl::MutexLock lock(&monitor_mu_);
    ++outcome_copies_asked_;
  }

  void RefreshOutcomes(absl::Time deadline) override {
    absl::MutexLock lock(&monitor_mu_);
    const uint64_t asked = ++outcome_copies_asked_;
    // The device monitor copies (it wakes for the request); a lost context or a stopping
    // executor ends the wait too, with the previous copy kept.
    auto copied = [this, asked]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(monitor_mu_) {
      return outcome_copies_done_ >= asked || monitor_stop_ || lost_.load();
    };
    monitor_mu_.AwaitWithDeadline(absl::Condition(&copied), deadline);
  }

  void SetFatalHandler(FatalHandler handler) override {
    absl::MutexLock lock(&fatal_mu_);
    fatal_handler_ = std::move(handler);
  }

  void Shutdown() override { ShutdownBy(absl::Now() + absl::Seconds(5)); }

  bool ShutdownBy(absl::Time deadline) override {
    if (pool_ == nullptr) return clean_;
    stopping_.store(true);
    {
      absl::MutexLock lock(&monitor_mu_);
      monitor_stop_ = true;
    }
    if (monitor_.joinable()) monitor_.join();
    {
      absl::MutexLock lock(&ledger_->mu);
      ledger_->pool = nullptr;
    }
    pool_->Shutdown();  // queued requests finish first (waits for the GPU give up: stopping_)
    // Then the GPU: what enqueue-only requests still hold is released here, unless a stream
    // still waits (for a client's event that never came) or the context is lost: then nothing
    // is freed (freeing would wait for that work), and the process's exit reclaims it all.
    clean_ = !lost_.load();
    for (const Worker& worker : workers_) {
      if (clean_ && !worker.slot->QuiesceBy(deadline)) clean_ = false;
    }
    if (!clean_) {
      {
        absl::MutexLock lock(&ledger_->mu);
        ledger_->abandoned = true;
      }
      LogWarning("%s: the device's memory, streams and IPC mappings are left to the process's exit",
                 lost_.load()
                     ? "the CUDA context is lost"
                     : "a stream slot still waits on the GPU (a client's ready event never "
                       "fired)");
      for (Worker& worker : workers_) {  // NOLINT: left to the exit
        worker.verify.release();
        worker.score.release();
        worker.slot.release();
      }
    }
    workers_.clear();
    pool_.reset();
    if (clean_ && outcome_host_ != nullptr) cudaFreeHost(outcome_host_);
    outcome_host_ = nullptr;
    return clean_;
  }

 private:
  absl::Status WarmupWorker(ScoreRunner& score, const std::shared_ptr<const ProbeSet>& set) {
    for (uint32_t rows : config_.warmup_rows) {
      if (absl::Status s = score.Warmup(set, static_cast<int32_t>(rows)); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // A Score or a Verify for whichever worker takes it: on that worker's slot when the slot is
  // idle; else the worker is parked (no shared work until its stream is past what it waits for)
  // and the task goes back to the head of the queue for another worker.
  template <typename Request>
  WorkerPool::Task GpuTask(Request request, std::unique_ptr<typename Request::Job> job,
                           Clock::time_point submitted, typename Request::Done done) {
    return [this, request, job = std::move(job), submitted,
            done = std::move(done)](int worker) mutable {
      typename Request::Outcome outcome;
      if (worker == WorkerPool::kRefused) {
        std::move(done)(std::move(job), Refused(), outcome);
        return;
      }
      if (lost_.load()) {
        std::move(done)(std::move(job), LostStatus(), outcome);
        return;
      }
      if (!Admit(worker)) {
        pool_->SubmitFront(GpuTask(request, std::move(job), submitted, std::move(done)));
        return;
      }
      Request::QueueSeconds(outcome) = SecondsSince(submitted);
      if (absl::Status alive = job->lifetime.Check(); !alive.ok()) {
        drops_.Count(alive);
        std::move(done)(std::move(job), alive, outcome);
        return;
      }
      gpu_requests_.fetch_add(1, std::memory_order_relaxed);
      Worker& on = workers_[worker];
      on.slot->DrainCompleted();
      absl::Status status = Checked(request.Run(on, *job, &outcome), Request::kName);
      if (status.ok() && !Request::Enqueued(outcome) && lost_.load()) {
        // Computed while the context was being lost: no answer from a lost context is trusted.
        status = LostStatus();
      }
      drops_.Count(status);  // given up at its deadline, or for a caller gone, on the GPU
      ParkIfBusy(worker);
      std::move(done)(std::move(job), status, outcome);
    };
  }

  // Whether `worker`'s slot may take a request now: its stream is idle. Otherwise the worker is
  // parked until the GPU is past the pending work (the host callback that follows that work
  // nudges the worker, MaybeUnpark).
  bool Admit(int worker) {
    if (workers_[worker].slot->Idle()) return true;
    Park(worker);
    return false;
  }

  // After a request: a slot whose stream still has its work pending (enqueue-only, or given up
  // at the deadline) is parked at once, so that no request is queued behind work that may wait
  // on a client's event for long.
  void ParkIfBusy(int worker) {
    if (!workers_[worker].slot->Idle()) Park(worker);
  }

  void Park(int worker) {
    StreamSlot& slot = *workers_[worker].slot;
    if (!slot.parked()) slot.SetParked(true);
    pool_->SetTakesShared(worker, false);
    // The work may have finished meanwhile, its nudge already handled: check again.
    MaybeUnpark(worker);
  }

  void MaybeUnpark(int worker) {
    StreamSlot& slot = *workers_[worker].slot;
    if (!slot.parked() || !slot.Idle()) return;
    const double seconds = slot.parked_seconds();
    slot.SetParked(false);
    pool_->SetTakesShared(worker, true);
    if (seconds >= kParkedWarnSeconds) {
      LogInfo("stream slot %d takes requests again after %.1f s waiting on the GPU", worker,
              seconds);
    }
  }

  // A request's status, after a look at the device when it is a CUDA error: where the context
  // is lost, every request from now on fails and the fatal handler is told.
  absl::Status Checked(absl::Status status, const char* what) {
    if (status.code() != absl::StatusCode::kInternal) return status;
    if (lost_.load() || ContextLost(status)) {
      return absl::InternalError(
          absl::StrCat(status.message(), " (the GPU's CUDA context is lost: the server stops)"));
    }
    LogError("CUDA %s failed: %s", what, status.message());
    return status;
  }

  // Whether the context is unusable (a sticky error: an illegal address, a kernel fault, an
  // uncorrectable ECC error...): after clearing this thread's last error, work enqueued on a
  // stream of its own still fails. Non-sticky errors (an out-of-memory, a bad argument) leave the
  // context usable. Marks it lost (once) when it is. (The slots' streams are not queried: one may
  // be capturing a graph on its worker, and a query would break the capture.)
  bool ContextLost(const absl::Status& seen) {
    cudaError_t e = cudaSuccess;
    {
      absl::MutexLock lock(&probe_mu_);
      cudaSetDevice(config_.device);
      cudaGetLastError();
      e = cudaEventRecord(probe_event_, probe_stream_);
      if (e == cudaSuccess) e = cudaStreamSynchronize(probe_stream_);  // nothing else runs there
      if (e == cudaSuccess) e = cudaEventQuery(probe_event_);
    }
    if (e == cudaSuccess) return false;
    MarkLost(seen.ok() ? CudaStatus(e, "checking the CUDA context") : seen, e);
    return true;
  }

  void MarkLost(const absl::Status& seen, cudaError_t error) {
    if (lost_.exchange(true)) return;
    // Nothing will complete on this context: requests waiting for a client's ready event or for
    // the GPU stop waiting now (UNAVAILABLE), not at the end of the grace period.
    stopping_.store(true, std::memory_order_release);
    {
      absl::MutexLock lock(&lost_mu_);
      lost_status_ = absl::UnavailableError(
          absl::StrCat("the GPU's CUDA context is lost (", cudaGetErrorName(error), ": ",
                       cudaGetErrorString(error), ", first seen in: ", seen.message(),
                       "); this server stops: retry on its replacement"));
    }
    LogError(
        "the CUDA context of device %d is lost: %s: %s (first seen in: %s). Health reports "
        "NOT_SERVING, every request fails, and the server exits (status 3) for its supervisor to "
        "restart it",
        config_.device, cudaGetErrorName(error), cudaGetErrorString(error), seen.message());
    FatalHandler handler;
    {
      absl::MutexLock lock(&fatal_mu_);
      handler = std::move(fatal_handler_);
    }
    if (handler) std::move(handler)(LostStatus());
  }

  absl::Status LostStatus() const {
    absl::MutexLock lock(&lost_mu_);
    return lost_status_;
  }

  // Every 100 ms: whether the context is still usable (a fault in work answered already, e.g.
  // enqueue-only, shows here even when no request comes), and slots parked for long, said once.
  // When asked (RefreshOutcomes, RequestOutcomeRefresh), at once: the copy of the probe-outcome
  // counters.
  void Monitor() {
    cudaSetDevice(config_.device);
    Clock::time_point next_check = Clock::now();
    while (true) {
      uint64_t asked = 0, done = 0;
      {
        absl::MutexLock lock(&monitor_mu_);
        auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(monitor_mu_) {
          return monitor_stop_ || outcome_copies_asked_ > outcome_copies_done_;
        };
        const auto until_check =
            std::chrono::duration_cast<std::chrono::microseconds>(next_check - Clock::now());
        monitor_mu_.AwaitWithTimeout(absl::Condition(&wake),
                                     absl::Microseconds(std::max<int64_t>(0, until_check.count())));
        if (monitor_stop_) return;
        asked = outcome_copies_asked_;
        done = outcome_copies_done_;
      }
      if (asked > done) {
        CopyOutcomes();
        absl::MutexLock lock(&monitor_mu_);
        outcome_copies_done_ = asked;
      }
      if (Clock::now() < next_check) continue;
      next_check = Clock::now() + std::chrono::milliseconds(100);
      if (!lost_.load()) ContextLost(absl::OkStatus());
      for (size_t i = 0; i < workers_.size(); ++i) {
        StreamSlot& slot = *workers_[i].slot;
        if (slot.parked() && slot.parked_seconds() >= kParkedWarnSeconds &&
            slot.TakeParkWarning()) {
          LogWarning(
              "stream slot %d has waited %.1f s on the GPU for work whose ready event has not "
              "fired (a client's stream is stuck, or the client is gone); it takes no request "
              "until the GPU is past that work; %d of %d slots serve meanwhile",
              static_cast<int>(i), slot.parked_seconds(),
              static_cast<int>(std::count_if(workers_.begin(), workers_.end(),
                                             [](const Worker& w) { return !w.slot->parked(); })),
              static_cast<int>(workers_.size()));
        }
      }
    }
  }

  // Copies every live set's outcome counters (the label slots in use), and each stream slot's
  // running total of non-finite device scores, to pinned host memory on the probe stream, waits,
  // and publishes each copy: one batch per request for a copy, however many Score requests ran
  // since. On a CUDA error the previous copies stay.
  void CopyOutcomes() {
    if (lost_.load()) return;
    std::vector<std::shared_ptr<DeviceOutcomeCounters>> live;
    {
      absl::MutexLock lock(&outcomes_mu_);
      for (const auto& weak : outcomes_) {
        if (auto counters = weak.lock()) live.push_back(std::move(counters));
      }
    }
    std::vector<int64_t> offsets;
    int64_t words = 0;
    for (const auto& counters : live) {
      offsets.push_back(words);
      words += counters->CopyWords();
    }
    // The stream slots' totals come after the counters, one word each.
    const int64_t totals = words;
    const int64_t needed = totals + static_cast<int64_t>(workers_.size());
    if (needed > outcome_host_words_) {
      if (outcome_host_ != nullptr) cudaFreeHost(outcome_host_);
      outcome_host_ = nullptr;
      outcome_host_words_ = 0;
      if (cudaHostAlloc(reinterpret_cast<void**>(&outcome_host_), sizeof(uint64_t) * needed,
                        cudaHostAllocDefault) != cudaSuccess) {
        cudaGetLastError();
        outcome_host_ = nullptr;
        return;
      }
      outcome_host_words_ = needed;
    }
    std::vector<int> slots(live.size(), 0);
    cudaError_t e = cudaSuccess;
    {
      absl::MutexLock lock(&probe_mu_);
      for (size_t i = 0; i < live.size() && e == cudaSuccess; ++i) {
        const int64_t capacity = (i + 1 < live.size() ? offsets[i + 1] : totals) - offsets[i];
        e = live[i]->CopyTo(outcome_host_ + offsets[i], capacity, probe_stream_, &slots[i]);
      }
      for (size_t i = 0; i < workers_.size() && e == cudaSuccess; ++i) {
        e = workers_[i].score->CopyNonFiniteTotal(outcome_host_ + totals + i, probe_stream_);
      }
      if (e == cudaSuccess) e = cudaStreamSynchronize(probe_stream_);
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      LogWarning("copying the probe-outcome counters of device %d: %s: %s", config_.device,
                 cudaGetErrorName(e), cudaGetErrorString(e));
      return;
    }
    for (size_t i = 0; i < live.size(); ++i) live[i]->Publish(outcome_host_ + offsets[i], slots[i]);
    for (size_t i = 0; i < workers_.size(); ++i) {
      workers_[i].score->PublishNonFiniteTotal(outcome_host_[totals + i]);
    }
  }

  absl::Status Refused() const {
    if (pool_ == nullptr || stopping_.load()) {
      return absl::UnavailableError("the CUDA executor has stopped");
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        "the CUDA executor's queue is full (", pool_->capacity(), " requests wait for ",
        workers_.size(), " stream slots; --max-queued-requests); retry later"));
  }

  const Config config_;
  const std::string device_name_;
  const std::string compute_capability_;
  const std::vector<std::string> kernel_paths_;
  const bool mps_;
  std::atomic<uint64_t> gpu_requests_{0};
  const std::shared_ptr<DeviceMemoryLedger> ledger_;
  // Fixed after Init (read without a lock by counters and workers): one per worker thread.
  std::vector<Worker> workers_;
  std::unique_ptr<WorkerPool> pool_;
  DropCounter drops_;
  std::atomic<bool> stopping_{false};
  bool clean_ = true;
  // Device health: the context is lost after a sticky error.
  absl::Mutex probe_mu_;
  cudaStream_t probe_stream_ = nullptr;  // only the device check records on it
  cudaEvent_t probe_event_ = nullptr;
  std::atomic<bool> lost_{false};
  mutable absl::Mutex lost_mu_;
  absl::Status lost_status_ ABSL_GUARDED_BY(lost_mu_);
  absl::Mutex fatal_mu_;
  FatalHandler fatal_handler_ ABSL_GUARDED_BY(fatal_mu_);
  std::thread monitor_;
  absl::Mutex monitor_mu_;
  bool monitor_stop_ ABSL_GUARDED_BY(monitor_mu_) = false;
  // Copies of the probe-outcome counters asked for, and those the monitor has done (a copy
  // serves every request made before it started).
  uint64_t outcome_copies_asked_ ABSL_GUARDED_BY(monitor_mu_) = 0;
  uint64_t outcome_copies_done_ ABSL_GUARDED_BY(monitor_mu_) = 0;
  // The outcome counters of every set placed here (weak: they go with their set).
  absl::Mutex outcomes_mu_;
  std::vector<std::weak_ptr<DeviceOutcomeCounters>> outcomes_ ABSL_GUARDED_BY(outcomes_mu_);
  uint64_t* outcome_host_ = nullptr;  // pinned, the monitor's copy target
  int64_t outcome_host_words_ = 0;
  // TEST-ONLY (score_fault_hook.h): none unless the test binary installed one; Score requests are
  // counted only then.
  ScoreFaultHook fault_hook_;
  std::atomic<uint64_t> score_requests_{0};
};

}  // namespace

absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || count == 0) {
    cudaGetLastError();
    return absl::UnavailableError(absl::StrCat(
        "no usable CUDA device (cudaGetDeviceCount: ",
        e == cudaSuccess ? "0 devices"
                         : absl::StrCat(cudaGetErrorName(e), ": ", cudaGetErrorString(e)),
        ")"));
  }
  return count;
}

absl::StatusOr<std::unique_ptr<Executor>> CreateCudaExecutor(const Config& config) {
  absl::StatusOr<int> count = CudaDeviceCount();
  if (!count.ok()) return count.status();
  if (config.device >= *count) {
    return absl::UnavailableError(absl::StrCat("CUDA device ", config.device, " is not there (",
                                               *count, " CUDA devices: 0 to ", *count - 1, ")"));
  }
  cudaDeviceProp prop{};
  PS_RETURN_IF_CUDA(cudaGetDeviceProperties(&prop, config.device));
  // A GPU this build holds no code for fails here, not at its first request (FAILED_PRECONDITION:
  // MakeExecutor does not fall back to the CPU backend for it).
  if (const cudaError_t covered = kernels::CheckDeviceCovered(config.device);
      covered != cudaSuccess) {
    cudaGetLastError();
    if (covered == cudaErrorNoKernelImageForDevice) {
      return absl::FailedPreconditionError(UncoveredDeviceMessage(
          config.device, prop.name, prop.major, prop.minor, kernels::CudaBuildTargets()));
    }
    return CudaStatus(covered, "a kernel of this build on the device");
  }
  // The sm_90a paths where both workspaces take them: the sm_90a kernels run here, and the
  // driver's tensor-map encoder is found.
  const bool sm90a = kernels::Sm90aKernelsRunOn(prop.major, prop.minor) &&
                     kernels::blocks::TensorMapEncoderAvailable();
  LogInfo("CUDA device %d: %s, compute capability %d.%d; build targets %s; kernel paths %s",
          config.device, prop.name, prop.major, prop.minor, kernels::CudaBuildTargets(),
          absl::StrJoin(KernelPathsFor(sm90a), ", ").c_str());
  absl::StatusOr<bool> mps = MpsEnabled(config.device);
  if (!mps.ok()) {
    LogWarning("cannot tell whether this context uses MPS (%s): assuming it does not",
               mps.status().message());
  } else if (*mps) {
    LogInfo(
        "CUDA device %d: this context is an MPS client: its kernels run beside the inference "
        "server's. MPS suits Verify on the decode loop's critical path; it can also slow the "
        "inference server's own step (measured +29%% on a graphed transformers step of 747 "
        "kernels): docs/mps.md says how to check yours",
        config.device);
  }
  if (!mps.ok() || !*mps) {
    LogInfo(
        "CUDA device %d: no MPS: the GPU time-slices between this context and the inference "
        "server's, one switch per request that runs here. Probe scoring through a tap that "
        "sends a window of 16+ decode steps per Score keeps the switches rare (docs/mps.md); "
        "ServerInfo.gpu_requests and the alert ProbeSidecarFrequentContextSwitches count them",
        config.device);
  }
  auto executor =
      std::make_unique<CudaExecutor>(config, prop.name, absl::StrCat(prop.major, ".", prop.minor),
                                     KernelPathsFor(sm90a), mps.value_or(false));
  if (absl::Status s = executor->Init(); !s.ok()) return s;
  return std::unique_ptr<Executor>(std::move(executor));
}

}  // namespace probesidecar::server
