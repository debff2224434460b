#include "server/cuda_executor.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kernels/probe_score/probe_score.h"
#include "server/buffer_registry.h"
#include "server/cuda_ipc.h"
#include "server/graph_cache.h"
#include "server/log.h"

namespace probesidecar::server {
namespace {

using Clock = std::chrono::steady_clock;
using kernels::ProbeScoreDeviceArgs;
using kernels::ProbeScorePath;

absl::Status CudaStatus(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, ": ", cudaGetErrorName(error), ": ", cudaGetErrorString(error)));
}

#define PS_RETURN_IF_CUDA(call)                                           \
  do {                                                                    \
    if (absl::Status _s = CudaStatus((call), #call); !_s.ok()) return _s; \
  } while (0)

// A graph is specific to a probe set instance, a kernel path, a dtype, a row bucket and where the
// activations come from / the scores go (those decide which copies the graph contains).
struct GraphKey {
  uint64_t probe_set_id;
  ProbeScorePath path;
  common::DType dtype;
  int32_t bucket;
  bool inline_x;  // activations staged from the request (else read from an IPC buffer)
  bool host_out;  // scores copied back to the host (else written to an IPC buffer)
  bool timed;     // with CUDA event nodes around the stages
  auto Tie() const {
    return std::tie(probe_set_id, path, dtype, bucket, inline_x, host_out, timed);
  }
  bool operator<(const GraphKey& other) const { return Tie() < other.Tie(); }
};

struct GraphEntry {
  cudaGraphExec_t exec = nullptr;
  std::weak_ptr<const ProbeSet> probe_set;  // a graph is dropped once its set is gone
};

// A device (or pinned host) buffer that grows on demand; growing drops the graphs that baked the
// old address in.
struct Staging {
  void* ptr = nullptr;
  size_t bytes = 0;
};

size_t Grown(size_t need, size_t have) {
  size_t bytes = std::max<size_t>(have * 2, size_t{1} << 20);
  while (bytes < need) bytes *= 2;
  return bytes;
}

}  // namespace

// One stream with everything a request needs preallocated: the upload block (device args + row
// indices) in pinned and device memory, identity rows for staged activations, the scoring
// workspace, four timing events and a graph cache. Used by one request at a time.
class CudaWorker {
 public:
  CudaWorker(int device, const Config& config, std::atomic<int64_t>* device_bytes)
      : device_(device),
        max_bucket_(RowBucket(static_cast<int32_t>(config.max_rows))),
        timing_every_(config.gpu_timing_every),
        device_bytes_(device_bytes),
        graphs_(config.graph_cache_entries, [](GraphEntry& entry) {
          if (entry.exec != nullptr) cudaGraphExecDestroy(entry.exec);
        }) {}

  ~CudaWorker() {
    cudaSetDevice(device_);
    graphs_.Clear();
    if (workspace_ != nullptr) kernels::DestroyProbeScoreWorkspace(workspace_);
    for (cudaEvent_t e : events_) {
      if (e != nullptr) cudaEventDestroy(e);
    }
    cudaFreeHost(h_upload_);
    cudaFree(d_upload_);
    cudaFree(d_identity_rows_);
    cudaFreeHost(h_x_.ptr);
    cudaFree(d_x_.ptr);
    cudaFreeHost(h_out_.ptr);
    cudaFree(d_out_.ptr);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  absl::Status Init(const Config& config) {
    PS_RETURN_IF_CUDA(cudaSetDevice(device_));
    PS_RETURN_IF_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    for (cudaEvent_t& e : events_) PS_RETURN_IF_CUDA(cudaEventCreate(&e));
    upload_bytes_ = sizeof(ProbeScoreDeviceArgs) + sizeof(int32_t) * max_bucket_;
    PS_RETURN_IF_CUDA(
        cudaHostAlloc(reinterpret_cast<void**>(&h_upload_), upload_bytes_, cudaHostAllocDefault));
    PS_RETURN_IF_CUDA(cudaMalloc(reinterpret_cast<void**>(&d_upload_), upload_bytes_));
    PS_RETURN_IF_CUDA(
        cudaMalloc(reinterpret_cast<void**>(&d_identity_rows_), sizeof(int32_t) * max_bucket_));
    std::vector<int32_t> identity(max_bucket_);
    for (int32_t i = 0; i < max_bucket_; ++i) identity[i] = i;
    PS_RETURN_IF_CUDA(cudaMemcpy(d_identity_rows_, identity.data(), sizeof(int32_t) * max_bucket_,
                                 cudaMemcpyHostToDevice));
    std::memset(h_upload_, 0, upload_bytes_);
    kernels::ProbeScoreWorkspaceConfig ws;
    ws.max_rows = max_bucket_;
    ws.max_hidden = 65536;
    ws.max_probes = static_cast<int32_t>(config.max_probes);
    PS_RETURN_IF_CUDA(kernels::CreateProbeScoreWorkspace(ws, &workspace_));
    *device_bytes_ += static_cast<int64_t>(upload_bytes_ + sizeof(int32_t) * max_bucket_);
    return absl::OkStatus();
  }

  // Scores one job: stage, replay (capturing on first use), wait, copy out.
  absl::Status Run(const ScoreJob& job, const std::shared_ptr<const ProbeSet>& set,
                   ScoreTimings* timings) {
    PS_RETURN_IF_CUDA(cudaSetDevice(device_));
    const int32_t rows = job.num_rows;
    const int32_t bucket = RowBucket(rows);
    const int32_t hidden = set->hidden;
    const int32_t probes = set->num_probes;
    const common::DType dtype = job.activations.dtype;
    const int element = common::DTypeSize(dtype);
    const GraphKey key =
        KeyFor(*set, dtype, bucket, !job.activations.on_device(), job.host_out != nullptr,
               timing_every_ > 0 && requests_++ % timing_every_ == 0);
    timings->kernel_path = kernels::ProbeScorePathName(key.path);
    PS_RETURN_IF_CUDA(ReserveFor(key, hidden, probes));

    // The per-request data, in the pinned upload block the graph copies from.
    auto* args = reinterpret_cast<ProbeScoreDeviceArgs*>(h_upload_);
    auto* row_ids = reinterpret_cast<int32_t*>(h_upload_ + sizeof(ProbeScoreDeviceArgs));
    args->num_rows = rows;
    if (key.inline_x) {
      // Only the selected rows travel: gathered here into [R, H], read back with identity rows.
      const auto* src = static_cast<const char*>(job.activations.host);
      auto* dst = static_cast<char*>(h_x_.ptr);
      const size_t row_bytes = static_cast<size_t>(hidden) * element;
      for (int32_t r = 0; r < rows; ++r) {
        std::memcpy(dst + r * row_bytes,
                    src + static_cast<size_t>(job.rows[r]) * job.activations.row_stride * element,
                    row_bytes);
      }
      args->x = d_x_.ptr;
      args->x_row_stride = hidden;
    } else {
      std::memcpy(row_ids, job.rows, sizeof(int32_t) * rows);
      // Padding rows point at row 0, which every request has: nothing can read out of bounds.
      std::fill(row_ids + rows, row_ids + bucket, 0);
      args->x = job.activations.device.device_ptr;
      args->x_row_stride = job.activations.row_stride;
    }
    if (key.host_out) {
      args->out = static_cast<float*>(d_out_.ptr);
      args->out_row_stride = probes;
    } else {
      args->out = static_cast<float*>(job.device_out.device.device_ptr);
      args->out_row_stride = job.device_out.row_stride;
    }

    absl::StatusOr<GraphEntry*> entry = GraphFor(key, set);
    if (!entry.ok()) return entry.status();
    PS_RETURN_IF_CUDA(cudaGraphLaunch((*entry)->exec, stream_));
    if (key.timed) {
      PS_RETURN_IF_CUDA(cudaEventSynchronize(events_[3]));
      float h2d_ms = 0, kernel_ms = 0, d2h_ms = 0;
      PS_RETURN_IF_CUDA(cudaEventElapsedTime(&h2d_ms, events_[0], events_[1]));
      PS_RETURN_IF_CUDA(cudaEventElapsedTime(&kernel_ms, events_[1], events_[2]));
      PS_RETURN_IF_CUDA(cudaEventElapsedTime(&d2h_ms, events_[2], events_[3]));
      timings->h2d = h2d_ms * 1e-3;
      timings->kernel = kernel_ms * 1e-3;
      timings->d2h = key.host_out ? d2h_ms * 1e-3 : 0.0;
    } else {
      PS_RETURN_IF_CUDA(cudaStreamSynchronize(stream_));
    }
    if (key.host_out) {
      std::memcpy(job.host_out, h_out_.ptr, sizeof(float) * rows * probes);
    }
    return absl::OkStatus();
  }

  // Captures the graphs of `set` for `bucket` ahead of traffic (activations staged and from IPC
  // buffers, scores to the host).
  absl::Status Warmup(const std::shared_ptr<const ProbeSet>& set, int32_t bucket) {
    PS_RETURN_IF_CUDA(cudaSetDevice(device_));
    bucket = RowBucket(std::min(bucket, max_bucket_));
    for (bool inline_x : {true, false}) {
      const GraphKey key = KeyFor(*set, common::DType::kBFloat16, bucket, inline_x,
                                  /*host_out=*/true, timing_every_ > 0);
      PS_RETURN_IF_CUDA(ReserveFor(key, set->hidden, set->num_probes));
      absl::StatusOr<GraphEntry*> entry = GraphFor(key, set);
      if (!entry.ok()) return entry.status();
    }
    return absl::OkStatus();
  }

  // Drops graphs whose probe set is gone (unloaded or replaced, and no request holds it).
  void DropStaleGraphs() {
    graphs_.EraseIf([](const GraphKey&, const GraphEntry& e) { return e.probe_set.expired(); });
  }

  // Readable from any thread (metrics scrapes), also while the worker runs.
  GraphCacheCounters counters() const {
    GraphCacheCounters c;
    c.entries = entries_.load(std::memory_order_relaxed);
    c.capacity = graphs_.capacity();
    c.hits = hits_.load(std::memory_order_relaxed);
    c.misses = misses_.load(std::memory_order_relaxed);
    c.captures = captures_.load(std::memory_order_relaxed);
    c.evictions = evictions_.load(std::memory_order_relaxed);
    return c;
  }

  // Publishes the cache's counters (called by the worker's user after each operation).
  void PublishCounters() {
    entries_.store(graphs_.size(), std::memory_order_relaxed);
    hits_.store(graphs_.hits(), std::memory_order_relaxed);
    misses_.store(graphs_.misses(), std::memory_order_relaxed);
    evictions_.store(graphs_.evictions(), std::memory_order_relaxed);
  }

 private:
  GraphKey KeyFor(const ProbeSet& set, common::DType dtype, int32_t bucket, bool inline_x,
                  bool host_out, bool timed) const {
    return GraphKey{
        set.id,   kernels::ChooseProbeScorePath(bucket, set.num_probes, set.hidden, dtype),
        dtype,    bucket,
        inline_x, host_out,
        timed};
  }

  // Grows the staging that a graph of `key` copies through. Growing drops the cached graphs, so
  // this comes before GraphFor.
  cudaError_t ReserveFor(const GraphKey& key, int32_t hidden, int32_t probes) {
    cudaError_t error = cudaSuccess;
    if (key.inline_x) {
      error = Reserve(h_x_, d_x_, size_t{1} * key.bucket * hidden * common::DTypeSize(key.dtype));
    }
    if (error == cudaSuccess && key.host_out) {
      error = Reserve(h_out_, d_out_, size_t{1} * key.bucket * probes * sizeof(float));
    }
    return error;
  }

  // The cached graph of `key`, captured on a miss.
  absl::StatusOr<GraphEntry*> GraphFor(const GraphKey& key,
                                       const std::shared_ptr<const ProbeSet>& set) {
    if (GraphEntry* entry = graphs_.Find(key); entry != nullptr) return entry;
    const auto* weights = static_cast<const kernels::ProbeWeights*>(set->backend_state.get());
    absl::StatusOr<cudaGraphExec_t> exec = Capture(key, *weights, set->activation);
    if (!exec.ok()) return exec.status();
    return &graphs_.Insert(key, GraphEntry{*exec, set});
  }

  // Grows a pinned + device staging pair to at least `bytes`.
  cudaError_t Reserve(Staging& host, Staging& device, size_t bytes) {
    if (bytes <= device.bytes) return cudaSuccess;
    const size_t grown = Grown(bytes, device.bytes);
    graphs_.Clear();  // they hold the old addresses
    cudaFreeHost(host.ptr);
    cudaFree(device.ptr);
    *device_bytes_ -= static_cast<int64_t>(device.bytes);
    host = Staging{};
    device = Staging{};
    cudaError_t e = cudaHostAlloc(&host.ptr, grown, cudaHostAllocDefault);
    if (e != cudaSuccess) return e;
    if ((e = cudaMalloc(&device.ptr, grown)) != cudaSuccess) {
      cudaFreeHost(host.ptr);
      host = Staging{};
      return e;
    }
    host.bytes = device.bytes = grown;
    *device_bytes_ += static_cast<int64_t>(grown);
    return cudaSuccess;
  }

  absl::StatusOr<cudaGraphExec_t> Capture(const GraphKey& key, const kernels::ProbeWeights& weights,
                                          kernels::Activation activation) {
    DropStaleGraphs();
    kernels::ProbeScoreParams params;
    params.x_dtype = key.dtype;
    params.args = reinterpret_cast<const ProbeScoreDeviceArgs*>(d_upload_);
    params.rows = key.inline_x
                      ? d_identity_rows_
                      : reinterpret_cast<const int32_t*>(d_upload_ + sizeof(ProbeScoreDeviceArgs));
    params.max_rows = key.bucket;
    params.weights = &weights;
    params.activation = activation;
    const size_t upload =
        sizeof(ProbeScoreDeviceArgs) + (key.inline_x ? 0 : sizeof(int32_t) * key.bucket);
    const int element = common::DTypeSize(key.dtype);

    // Event nodes mark the stage boundaries of timed graphs.
    auto mark = [&](int i) {
      return key.timed ? cudaEventRecordWithFlags(events_[i], stream_, cudaEventRecordExternal)
                       : cudaSuccess;
    };
    PS_RETURN_IF_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    cudaError_t error = mark(0);
    if (error == cudaSuccess) {
      error = cudaMemcpyAsync(d_upload_, h_upload_, upload, cudaMemcpyHostToDevice, stream_);
    }
    if (error == cudaSuccess && key.inline_x) {
      error = cudaMemcpyAsync(d_x_.ptr, h_x_.ptr, size_t{1} * key.bucket * weights.hidden * element,
                              cudaMemcpyHostToDevice, stream_);
    }
    if (error == cudaSuccess) error = mark(1);
    if (error == cudaSuccess)
      error = kernels::LaunchProbeScore(params, key.path, workspace_, stream_);
    if (error == cudaSuccess) error = mark(2);
    if (error == cudaSuccess && key.host_out) {
      error = cudaMemcpyAsync(h_out_.ptr, d_out_.ptr,
                              size_t{1} * key.bucket * weights.num_probes * sizeof(float),
                              cudaMemcpyDeviceToHost, stream_);
    }
    if (error == cudaSuccess) error = mark(3);
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
    if (error == cudaSuccess) error = end;
    cudaGraphExec_t exec = nullptr;
    if (error == cudaSuccess) error = cudaGraphInstantiate(&exec, graph, 0);
    if (graph != nullptr) cudaGraphDestroy(graph);
    if (error != cudaSuccess) {
      cudaGetLastError();
      return CudaStatus(
          error, absl::StrCat("capturing the ", kernels::ProbeScorePathName(key.path), " graph"));
    }
    ++captures_;
    return exec;
  }

  const int device_;
  const int32_t max_bucket_;
  const uint32_t timing_every_;
  uint64_t requests_ = 0;
  std::atomic<int64_t>* const device_bytes_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t events_[4] = {nullptr, nullptr, nullptr, nullptr};  // start, h2d, kernel, d2h
  size_t upload_bytes_ = 0;
  char* h_upload_ = nullptr;  // pinned: ProbeScoreDeviceArgs, then int32 rows [max_bucket]
  char* d_upload_ = nullptr;
  int32_t* d_identity_rows_ = nullptr;  // 0, 1, 2 ... for staged activations
  Staging h_x_, d_x_;                   // staged activation rows [bucket, H]
  Staging h_out_, d_out_;               // scores [bucket, P]
  kernels::ProbeScoreWorkspace* workspace_ = nullptr;
  LruCache<GraphKey, GraphEntry> graphs_;
  std::atomic<uint64_t> captures_{0};
  std::atomic<uint64_t> entries_{0}, hits_{0}, misses_{0}, evictions_{0};
};

namespace {

class CudaExecutor final : public Executor {
 public:
  CudaExecutor(const Config& config, std::string device_name)
      : config_(config),
        device_name_(std::move(device_name)),
        opener_(config.device),
        buffers_(config.device, &opener_) {}

  ~CudaExecutor() override { Shutdown(); }

  absl::Status Init() {
    for (uint32_t i = 0; i < config_.cuda_workers; ++i) {
      auto worker = std::make_unique<CudaWorker>(config_.device, config_, &device_bytes_);
      if (absl::Status s = worker->Init(config_); !s.ok()) return s;
      idle_.push_back(worker.get());
      workers_.push_back(std::move(worker));
    }
    return absl::OkStatus();
  }

  const char* backend() const override { return "cuda"; }
  std::string device_name() const override { return device_name_; }
  BufferRegistry* buffers() override { return &buffers_; }

  absl::Status PrepareProbeSet(ProbeSet& set) override {
    if (cudaError_t e = cudaSetDevice(config_.device); e != cudaSuccess) {
      return CudaStatus(e, "cudaSetDevice");
    }
    auto weights = std::make_unique<kernels::ProbeWeights>();
    if (cudaError_t e = kernels::CreateProbeWeights(set.weight.data(), set.bias.data(),
                                                    set.num_probes, set.hidden, weights.get());
        e != cudaSuccess) {
      return CudaStatus(e, absl::StrCat("uploading the weights of probe set '", set.name, "'"));
    }
    const int64_t bytes = static_cast<int64_t>(weights->storage_bytes);
    device_bytes_ += bytes;
    const int device = config_.device;
    std::atomic<int64_t>* counter = &device_bytes_;
    set.backend_state =
        std::shared_ptr<const void>(weights.release(), [device, counter, bytes](const void* p) {
          auto* w =
              const_cast<kernels::ProbeWeights*>(static_cast<const kernels::ProbeWeights*>(p));
          cudaSetDevice(device);
          kernels::DestroyProbeWeights(w);
          delete w;
          *counter -= bytes;
        });
    return absl::OkStatus();
  }

  // Every worker captures the set's graphs for the configured row buckets (waiting for each to
  // be idle), so that the first requests replay instead of capturing.
  void Warmup(const std::shared_ptr<const ProbeSet>& set) override {
    std::vector<CudaWorker*> all;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& w : workers_) all.push_back(w.get());
    }
    for (CudaWorker* worker : all) {
      AcquireThis(worker);
      absl::Status status;
      for (uint32_t rows : config_.warmup_rows) {
        status = worker->Warmup(set, static_cast<int32_t>(rows));
        if (!status.ok()) break;
      }
      worker->PublishCounters();
      Release(worker);
      if (!status.ok()) {
        LogWarning("warm-up of probe set '%s': %s", set->name, status.message());
        return;
      }
    }
  }

  void Score(const ScoreJob* job, ScoreDone done) override {
    const Clock::time_point submitted = Clock::now();
    CudaWorker* worker = Acquire();
    ScoreTimings timings;
    timings.queue = std::chrono::duration<double>(Clock::now() - submitted).count();
    absl::Status status = worker->Run(*job, job->probe_set, &timings);
    worker->PublishCounters();
    Release(worker);
    if (!status.ok()) LogError("CUDA Score failed: %s", status.message());
    std::move(done)(status, timings);
  }

  GraphCacheCounters graph_cache() const override {
    absl::MutexLock lock(&mu_);
    GraphCacheCounters total;
    for (const auto& w : workers_) {
      const GraphCacheCounters c = w->counters();
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
    return static_cast<uint64_t>(std::max<int64_t>(0, device_bytes_.load()));
  }

  void Shutdown() override {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &CudaExecutor::AllIdle));
    idle_.clear();
    workers_.clear();
  }

 private:
  bool AllIdle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return idle_.size() == workers_.size();
  }
  bool AnyIdle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !idle_.empty(); }

  void AcquireThis(CudaWorker* worker) {
    absl::MutexLock lock(&mu_);
    auto idle = [this, worker]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return std::find(idle_.begin(), idle_.end(), worker) != idle_.end();
    };
    mu_.Await(absl::Condition(&idle));
    idle_.erase(std::find(idle_.begin(), idle_.end(), worker));
  }

  CudaWorker* Acquire() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &CudaExecutor::AnyIdle));
    CudaWorker* w = idle_.back();
    idle_.pop_back();
    return w;
  }

  void Release(CudaWorker* worker) {
    absl::MutexLock lock(&mu_);
    idle_.push_back(worker);
  }

  const Config config_;
  const std::string device_name_;
  CudaIpcOpener opener_;
  BufferRegistry buffers_;
  std::atomic<int64_t> device_bytes_{0};
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<CudaWorker>> workers_ ABSL_GUARDED_BY(mu_);
  std::vector<CudaWorker*> idle_ ABSL_GUARDED_BY(mu_);
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
  if (cudaError_t e = cudaGetDeviceProperties(&prop, config.device); e != cudaSuccess) {
    return CudaStatus(e, "cudaGetDeviceProperties");
  }
  auto executor = std::make_unique<CudaExecutor>(config, prop.name);
  if (absl::Status s = executor->Init(); !s.ok()) return s;
  return std::unique_ptr<Executor>(std::move(executor));
}

}  // namespace probesidecar::server
