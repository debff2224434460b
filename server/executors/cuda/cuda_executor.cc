#include "server/executors/cuda/cuda_executor.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "server/executors/cuda/cuda_device.h"
#include "server/executors/cuda/cuda_placement.h"
#include "server/executors/cuda/cuda_worker.h"
#include "server/executors/cuda/device_health.h"
#include "server/executors/cuda/device_memory_ledger.h"
#include "server/executors/cuda/outcome_copier.h"
#include "server/executors/cuda/slot_parking.h"
#include "server/executors/drop_counter.h"
#include "server/executors/worker_pool.h"
#include "server/observability/log.h"
#include "server/observability/outcome_labels.h"

namespace probesidecar::server {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

class CudaExecutor final : public Executor {
 public:
  CudaExecutor(const Config& config, CudaDeviceFacts facts)
      : config_(config),
        info_{"cuda", facts.name, {config.device}, facts.compute_capability, facts.kernel_paths},
        mps_(facts.mps),
        ledger_(std::make_shared<DeviceMemoryLedger>()),
        health_(config.device, [this](const absl::Status& why) { OnLost(why); }),
        copier_(config.device) {}

  ~CudaExecutor() override { Shutdown(); }

  absl::Status Init() {
    fault_hook_ = InstalledScoreFaultHook();
    if (absl::Status s = health_.Init(); !s.ok()) return s;
    // One worker thread per stream slot, fed from one queue of --max-queued-requests.
    pool_ = std::make_unique<WorkerPool>(static_cast<int>(config_.cuda_workers),
                                         config_.max_queued_requests);
    {
      absl::MutexLock lock(&nudge_mu_);
      nudge_pool_ = pool_.get();
    }
    for (uint32_t i = 0; i < config_.cuda_workers; ++i) {
      // When the GPU finishes work answered before it ran (enqueue-only, or given up at a
      // deadline), the slot's worker releases what it held and, if the slot was parked, takes
      // requests again (the nudge comes from CUDA's callback thread, which may only queue work).
      auto nudge = [this, worker = static_cast<int>(i)] {
        absl::MutexLock lock(&nudge_mu_);
        if (nudge_pool_ == nullptr) return;  // stopped: a slot left to the process's exit
        nudge_pool_->SubmitTo(worker, [this](int w) {
          if (w == WorkerPool::kRefused) return;
          workers_[w].slot->DrainCompleted();
          parking_->MaybeUnpark(w);
        });
      };
      Worker& worker = workers_.emplace_back();
      worker.slot = std::make_unique<StreamSlot>(config_.device, std::move(nudge), &stopping_);
      if (absl::Status s = worker.slot->Init(); !s.ok()) return s;
      worker.score = std::make_unique<ScoreRunner>(worker.slot.get(), config_, &ledger_->bytes());
      if (absl::Status s = worker.score->Init(config_); !s.ok()) return s;
      worker.verify = std::make_unique<VerifyRunner>(worker.slot.get(), &ledger_->bytes(),
                                                     config_.graph_cache_entries);
    }
    ledger_->FreeOn(pool_.get());
    parking_ = std::make_unique<SlotParking>(&workers_, pool_.get());
    monitor_ = std::thread([this] { Monitor(); });
    return absl::OkStatus();
  }

  const ExecutorInfo& info() const override { return info_; }

  // The outcome copy `read` asks for first, then what the executor reports of itself.
  ExecutorStats ReadStats(const StatsRead& read) override {
    if (read.outcome_copy != OutcomeCopy::kNone) AskForOutcomeCopy(read);
    ExecutorStats stats;
    stats.device_memory_bytes = static_cast<uint64_t>(std::max<int64_t>(0, ledger_->held()));
    stats.queued = pool_ != nullptr ? pool_->queued() : 0;
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
    report.name = info_.device_name;
    report.compute_capability = info_.compute_capability;
    report.kernel_paths = info_.kernel_paths;
    report.memory_bytes = stats.device_memory_bytes;
    report.queued = stats.queued;
    report.gpu_requests = stats.gpu_requests;
    report.parked_slots = stats.parked_slots;
    report.graph_cache = stats.graph_cache;
    if (health_.lost()) report.failure = std::string(health_.LostStatus().message());
    return stats;
  }

  absl::Status Place(ProbeSet& set) override {
    absl::StatusOr<std::shared_ptr<const CudaPlacement>> placed = PlaceOnDevice(
        set, config_.device, OutcomeLabels::SlotsFor(config_.max_session_label_sets), ledger_);
    if (!placed.ok()) return placed.status();
    copier_.Track((*placed)->outcomes);
    set.placements[config_.device] = *std::move(placed);
    return absl::OkStatus();
  }

  // Every stream slot captures the set's graphs for the configured row buckets, on its own
  // worker thread (ahead of its next request), so that the first requests replay.
  void Warmup(std::shared_ptr<const ProbeSet> set, WarmupDone done) override {
    std::vector<WarmupDone> parts =
        SplitWarmupDone(std::move(done), static_cast<int>(workers_.size()));
    for (int i = 0; i < static_cast<int>(parts.size()); ++i) {
      pool_->SubmitTo(i, [this, set, part = std::move(parts[i])](int worker) mutable {
        // A parked slot (its stream still waits on the GPU) is skipped: it captures on first use.
        absl::Status status;
        if (worker == WorkerPool::kRefused) {
          status = absl::UnavailableError("the CUDA executor is shutting down");
        } else if (health_.lost()) {
          status = health_.LostStatus();
        } else if (!workers_[worker].slot->parked() && workers_[worker].slot->Idle()) {
          status = WarmupWorker(*workers_[worker].score, set);
        }
        std::move(part)(std::move(status));
      });
    }
  }

  void Submit(ExecutorTask task) override {
    if (health_.lost()) {
      Refuse(std::move(task), health_.LostStatus());
      return;
    }
    if (auto* score = std::get_if<ScoreTask>(&task)) {
      ScoreRequest request;
      if (fault_hook_.at != 0 && score_requests_.fetch_add(1) + 1 == fault_hook_.at) {
        request.fault = fault_hook_.launch;
      }
      pool_->Submit(
          GpuTask(request, std::move(score->job), Clock::now(), std::move(score->done)));
      return;
    }
    auto& verify = std::get<VerifyTask>(task);
    pool_->Submit(
        GpuTask(VerifyRequest{}, std::move(verify.job), Clock::now(), std::move(verify.done)));
  }

  kernels::ProbeOutcomeCounts OutcomeCounts(const ProbeSet& set) const override {
    const CudaPlacement* placed = set.PlacementAs<CudaPlacement>(config_.device);
    return placed != nullptr ? placed->outcomes->Read() : kernels::ProbeOutcomeCounts{};
  }

  bool ShutdownBy(absl::Time deadline) override {
    if (pool_ == nullptr) return clean_;
    stopping_.store(true);
    {
      absl::MutexLock lock(&monitor_mu_);
      monitor_stop_ = true;
    }
    if (monitor_.joinable()) monitor_.join();
    ledger_->FreeOn(nullptr);
    pool_->Shutdown();  // queued requests finish first (waits for the GPU give up: stopping_)
    // Then the GPU: what enqueue-only requests still hold is released here, unless a stream
    // still waits (for a client's event that never came) or the context is lost: then nothing
    // is freed (freeing would wait for that work), and the process's exit reclaims it all.
    clean_ = !health_.lost();
    for (const Worker& worker : workers_) {
      if (clean_ && !worker.slot->QuiesceBy(deadline)) clean_ = false;
    }
    if (!clean_) {
      ledger_->Abandon();
      copier_.Abandon();
      LogWarning("%s: the device's memory, streams and IPC mappings are left to the process's exit",
                 health_.lost()
                     ? "the CUDA context is lost"
                     : "a stream slot still waits on the GPU (a client's ready event never "
                       "fired)");
      for (Worker& worker : workers_) {  // NOLINT: left to the exit
        worker.verify.release();
        worker.score.release();
        worker.slot.release();
      }
    }
    {
      // A slot left to the process's exit (above) may still call back when its stream moves on:
      // from here on its nudge finds no pool.
      absl::MutexLock lock(&nudge_mu_);
      nudge_pool_ = nullptr;
    }
    parking_.reset();
    workers_.clear();
    pool_.reset();
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
      typename Request::Result result;
      if (worker == WorkerPool::kRefused) {
        std::move(done)(std::move(job), Refused(), result);
        return;
      }
      if (health_.lost()) {
        std::move(done)(std::move(job), health_.LostStatus(), result);
        return;
      }
      if (!parking_->Admit(worker)) {
        pool_->SubmitFront(GpuTask(request, std::move(job), submitted, std::move(done)));
        return;
      }
      Request::QueueSeconds(result) = SecondsSince(submitted);
      if (absl::Status alive = job->lifetime.Check(); !alive.ok()) {
        drops_.Count(alive);
        std::move(done)(std::move(job), alive, result);
        return;
      }
      gpu_requests_.fetch_add(1, std::memory_order_relaxed);
      Worker& on = workers_[worker];
      on.slot->DrainCompleted();
      absl::Status status = health_.Checked(request.Run(on, *job, &result), Request::kName);
      if (status.ok() && !Request::Enqueued(result) && health_.lost()) {
        // Computed while the context was being lost: no answer from a lost context is trusted.
        status = health_.LostStatus();
      }
      drops_.Count(status);  // given up at its deadline, or for a caller gone, on the GPU
      parking_->ParkIfBusy(worker);
      std::move(done)(std::move(job), status, result);
    };
  }

  // Once the context is lost: nothing will complete on it, so requests waiting for a client's
  // ready event or for the GPU stop waiting now (UNAVAILABLE), not at the end of the grace
  // period; the server is told.
  void OnLost(const absl::Status& why) {
    stopping_.store(true, std::memory_order_release);
    ReportFatal(why);
  }

  // Asks the device monitor (which wakes for it) for the copy of the outcome counters `read`
  // wants; waits for it until read.wait_until where asked. A lost context or a stopping executor
  // ends the wait too, with the previous copy kept.
  void AskForOutcomeCopy(const StatsRead& read) {
    absl::MutexLock lock(&monitor_mu_);
    const uint64_t asked = ++outcome_copies_asked_;
    if (read.outcome_copy != OutcomeCopy::kWait) return;
    auto copied = [this, asked]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(monitor_mu_) {
      return outcome_copies_done_ >= asked || monitor_stop_ || health_.lost();
    };
    monitor_mu_.AwaitWithDeadline(absl::Condition(&copied), read.wait_until);
  }

  // Every 100 ms: whether the context is still usable (a fault in work answered already, e.g.
  // enqueue-only, shows here even when no request comes), and slots parked for long, said once.
  // When asked (ReadStats' outcome copy), at once: the copy of the probe-outcome counters.
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
        copier_.Copy(health_, workers_);
        absl::MutexLock lock(&monitor_mu_);
        outcome_copies_done_ = asked;
      }
      if (Clock::now() < next_check) continue;
      next_check = Clock::now() + std::chrono::milliseconds(100);
      if (!health_.lost()) health_.CheckContext(absl::OkStatus());
      parking_->WarnLongParked();
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
  const ExecutorInfo info_;
  const bool mps_;
  std::atomic<uint64_t> gpu_requests_{0};
  const std::shared_ptr<DeviceMemoryLedger> ledger_;
  DeviceHealth health_;
  OutcomeCopier copier_;
  // Fixed after Init (read without a lock by counters and workers): one per worker thread.
  std::vector<Worker> workers_;
  std::unique_ptr<WorkerPool> pool_;
  // The pool as the slots' nudges (CUDA's callback thread) see it: null once stopped.
  absl::Mutex nudge_mu_;
  WorkerPool* nudge_pool_ ABSL_GUARDED_BY(nudge_mu_) = nullptr;
  std::unique_ptr<SlotParking> parking_;
  DropCounter drops_;
  std::atomic<bool> stopping_{false};
  bool clean_ = true;
  std::thread monitor_;
  absl::Mutex monitor_mu_;
  bool monitor_stop_ ABSL_GUARDED_BY(monitor_mu_) = false;
  // Copies of the probe-outcome counters asked for, and those the monitor has done (a copy
  // serves every request made before it started).
  uint64_t outcome_copies_asked_ ABSL_GUARDED_BY(monitor_mu_) = 0;
  uint64_t outcome_copies_done_ ABSL_GUARDED_BY(monitor_mu_) = 0;
  // TEST-ONLY (score_fault_hook.h): none unless the test binary installed one; Score requests are
  // counted only then.
  ScoreFaultHook fault_hook_;
  std::atomic<uint64_t> score_requests_{0};
};

}  // namespace

absl::StatusOr<std::unique_ptr<Executor>> CreateCudaExecutor(const Config& config) {
  absl::StatusOr<CudaDeviceFacts> facts = ReadCudaDevice(config.device);
  if (!facts.ok()) return facts.status();
  auto executor = std::make_unique<CudaExecutor>(config, *std::move(facts));
  if (absl::Status s = executor->Init(); !s.ok()) return s;
  return std::unique_ptr<Executor>(std::move(executor));
}

}  // namespace probesidecar::server
