#include "server/executors/cuda/cuda_executor.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kernels/probe_score/probe_score.h"
#include "server/buffers/buffer_registry.h"
#include "server/buffers/cuda_ipc.h"
#include "server/executors/cuda/cuda_status.h"
#include "server/executors/cuda/stream_slot.h"
#include "server/executors/cuda/verify_runner.h"
#include "server/executors/drop_counter.h"
#include "server/executors/worker_pool.h"
#include "server/observability/log.h"

namespace probesidecar::server {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// What outlives the executor: the device-memory count, and the way back to a worker thread for
// freeing a probe set's weights. cudaFree waits for the device, and the last reference to a probe
// set can drop anywhere (a gRPC thread that listed the sets, say), so the free is handed to a
// worker thread while the executor runs; once it has stopped, whoever drops the reference frees.
struct SharedState {
  std::atomic<int64_t> device_bytes{0};
  absl::Mutex mu;
  WorkerPool* pool ABSL_GUARDED_BY(mu) = nullptr;

  void Free(absl::AnyInvocable<void() &&> free) {
    absl::MutexLock lock(&mu);
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

class CudaExecutor final : public Executor {
 public:
  CudaExecutor(const Config& config, std::string device_name, bool mps)
      : config_(config),
        device_name_(std::move(device_name)),
        mps_(mps),
        opener_(config.device),
        buffers_(config.device, &opener_,
                 BufferRegistryLimits{4096, config.max_session_buffer_bytes,
                                      config.allow_sessionless_buffers}),
        state_(std::make_shared<SharedState>()) {}

  ~CudaExecutor() override { Shutdown(); }

  absl::Status Init() {
    // One worker thread per stream slot, fed from one queue of --max-queued-requests.
    pool_ = std::make_unique<WorkerPool>(static_cast<int>(config_.cuda_workers),
                                         config_.max_queued_requests);
    for (uint32_t i = 0; i < config_.cuda_workers; ++i) {
      // When the GPU finishes an enqueue-only request, the slot's worker releases what it held
      // (the nudge comes from CUDA's callback thread, which may only queue work).
      auto nudge = [this, worker = static_cast<int>(i)] {
        pool_->SubmitTo(worker, [this](int w) {
          if (w != WorkerPool::kRefused) slots_[w]->DrainCompleted();
        });
      };
      auto slot = std::make_unique<StreamSlot>(config_.device, config_, &state_->device_bytes,
                                               std::move(nudge));
      if (absl::Status s = slot->Init(config_); !s.ok()) return s;
      verifiers_.push_back(std::make_unique<VerifyRunner>(
          config_.device, slot->stream(), &state_->device_bytes, config_.graph_cache_entries));
      slots_.push_back(std::move(slot));
    }
    absl::MutexLock lock(&state_->mu);
    state_->pool = pool_.get();
    return absl::OkStatus();
  }

  const char* backend() const override { return "cuda"; }
  std::string device_name() const override { return device_name_; }
  BufferRegistry* buffers() override { return &buffers_; }

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
    state_->device_bytes += bytes;
    const int device = config_.device;
    set.backend_state = std::shared_ptr<const void>(
        weights.release(), [device, bytes, state = state_](const void* p) {
          auto* w =
              const_cast<kernels::ProbeWeights*>(static_cast<const kernels::ProbeWeights*>(p));
          state->Free([device, bytes, w, state] {
            cudaSetDevice(device);
            kernels::DestroyProbeWeights(w);
            delete w;
            state->device_bytes -= bytes;
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
    if (slots_.empty()) {
      std::move(done)(absl::OkStatus());
      return;
    }
    auto countdown = std::make_shared<Countdown>();
    countdown->remaining = static_cast<int>(slots_.size());
    countdown->done = std::move(done);
    for (int i = 0; i < static_cast<int>(slots_.size()); ++i) {
      pool_->SubmitTo(i, [this, set, countdown](int worker) {
        absl::Status status = worker == WorkerPool::kRefused
                                  ? absl::UnavailableError("the CUDA executor is shutting down")
                                  : WarmupSlot(*slots_[worker], set);
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

  void Score(const ScoreJob* job, ScoreDone done) override {
    const Clock::time_point submitted = Clock::now();
    pool_->Submit([this, job, submitted, done = std::move(done)](int worker) mutable {
      ScoreTimings timings;
      if (worker == WorkerPool::kRefused) {
        std::move(done)(Refused(), timings);
        return;
      }
      timings.queue = SecondsSince(submitted);
      if (absl::Status alive = job->lifetime.Check(); !alive.ok()) {
        drops_.Count(alive);
        std::move(done)(alive, timings);
        return;
      }
      gpu_requests_.fetch_add(1, std::memory_order_relaxed);
      absl::Status status = slots_[worker]->Run(*job, &timings, &timings.enqueued);
      if (!status.ok()) LogError("CUDA Score failed: %s", status.message());
      std::move(done)(status, timings);
    });
  }

  void Verify(const VerifyJob* job, VerifyDone done) override {
    const Clock::time_point submitted = Clock::now();
    pool_->Submit([this, job, submitted, done = std::move(done)](int worker) mutable {
      VerifyOutcome outcome;
      if (worker == WorkerPool::kRefused) {
        std::move(done)(Refused(), outcome);
        return;
      }
      outcome.queue_seconds = SecondsSince(submitted);
      if (absl::Status alive = job->lifetime.Check(); !alive.ok()) {
        drops_.Count(alive);
        std::move(done)(alive, outcome);
        return;
      }
      gpu_requests_.fetch_add(1, std::memory_order_relaxed);
      absl::Status status = verifiers_[worker]->Run(*job, &outcome);
      if (status.code() == absl::StatusCode::kInternal) {
        LogError("CUDA Verify failed: %s", status.message());
      }
      std::move(done)(status, outcome);
    });
  }

  uint64_t invalid_verify_requests() const override {
    uint64_t total = 0;
    for (const auto& verifier : verifiers_) total += verifier->invalid_requests();
    return total;
  }

  GraphCacheCounters graph_cache() const override {
    GraphCacheCounters total;
    for (const auto& slot : slots_) {
      const GraphCacheCounters c = slot->counters();
      total.entries += c.entries;
      total.capacity += c.capacity;
      total.hits += c.hits;
      total.misses += c.misses;
      total.captures += c.captures;
      total.evictions += c.evictions;
    }
    return total;
  }

  uint64_t device_memory_bytes() const override {
    return static_cast<uint64_t>(std::max<int64_t>(0, state_->device_bytes.load()));
  }

  uint64_t queued() const override { return pool_ != nullptr ? pool_->queued() : 0; }
  uint64_t queue_capacity() const override { return config_.max_queued_requests; }
  DroppedRequests dropped() const override { return drops_.counts(); }
  bool mps() const override { return mps_; }
  uint64_t gpu_requests() const override {
    return gpu_requests_.load(std::memory_order_relaxed);
  }

  uint64_t invalid_device_rows() const override {
    uint64_t total = 0;
    for (const auto& slot : slots_) total += slot->invalid_rows();
    return total;
  }

  void Shutdown() override {
    if (pool_ == nullptr) return;
    {
      absl::MutexLock lock(&state_->mu);
      state_->pool = nullptr;
    }
    pool_->Shutdown();  // queued requests finish first
    // Then the GPU: what enqueue-only requests still hold is released here.
    for (const auto& slot : slots_) slot->Quiesce();
    verifiers_.clear();  // before the slots: they run on the slots' streams
    slots_.clear();
    pool_.reset();
  }

 private:
  absl::Status WarmupSlot(StreamSlot& slot, const std::shared_ptr<const ProbeSet>& set) {
    for (uint32_t rows : config_.warmup_rows) {
      if (absl::Status s = slot.Warmup(set, static_cast<int32_t>(rows)); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::Status Refused() const {
    if (pool_ == nullptr) return absl::UnavailableError("the CUDA executor has stopped");
    return absl::ResourceExhaustedError(absl::StrCat(
        "the CUDA executor's queue is full (", pool_->capacity(), " requests wait for ",
        slots_.size(), " stream slots; --max-queued-requests); retry later"));
  }

  const Config config_;
  const std::string device_name_;
  const bool mps_;
  std::atomic<uint64_t> gpu_requests_{0};
  CudaIpcOpener opener_;
  BufferRegistry buffers_;
  const std::shared_ptr<SharedState> state_;
  // Fixed after Init (read without a lock by counters and workers).
  std::vector<std::unique_ptr<StreamSlot>> slots_;
  std::vector<std::unique_ptr<VerifyRunner>> verifiers_;  // one per slot, on its stream
  std::unique_ptr<WorkerPool> pool_;
  DropCounter drops_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Executor>> CreateCudaExecutor(const Config& config) {
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || count == 0) {
    cudaGetLastError();
    return absl::UnavailableError(absl::StrCat(
        "no usable CUDA device (cudaGetDeviceCount: ",
        e == cudaSuccess ? "0 devices"
                         : absl::StrCat(cudaGetErrorName(e), ": ", cudaGetErrorString(e)),
        ")"));
  }
  if (config.device >= count) {
    return absl::UnavailableError(
        absl::StrCat("--device ", config.device, " but only ", count, " CUDA devices"));
  }
  cudaDeviceProp prop{};
  PS_RETURN_IF_CUDA(cudaGetDeviceProperties(&prop, config.device));
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
  auto executor = std::make_unique<CudaExecutor>(config, prop.name, mps.value_or(false));
  if (absl::Status s = executor->Init(); !s.ok()) return s;
  return std::unique_ptr<Executor>(std::move(executor));
}

}  // namespace probesidecar::server
