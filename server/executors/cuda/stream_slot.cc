#include "server/executors/cuda/stream_slot.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/executors/cuda/cuda_status.h"
#include "server/executors/cuda/row_buckets.h"

namespace probesidecar::server {
namespace {

using kernels::ProbeScoreDeviceArgs;

size_t Grown(size_t need, size_t have) {
  size_t bytes = std::max<size_t>(have * 2, size_t{1} << 20);
  while (bytes < need) bytes *= 2;
  return bytes;
}

}  // namespace

StreamSlot::StreamSlot(int device, const Config& config, std::atomic<int64_t>* device_bytes)
    : device_(device),
      max_bucket_(RowBucket(static_cast<int32_t>(config.max_rows))),
      timing_every_(config.gpu_timing_every),
      device_bytes_(device_bytes),
      graphs_(config.graph_cache_entries, [](GraphEntry& entry) {
        if (entry.exec != nullptr) cudaGraphExecDestroy(entry.exec);
      }) {}

StreamSlot::~StreamSlot() {
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

absl::Status StreamSlot::Init(const Config& config) {
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

absl::Status StreamSlot::Run(const ScoreJob& job, ScoreTimings* timings) {
  const std::shared_ptr<const ProbeSet>& set = job.probe_set;
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

absl::Status StreamSlot::Warmup(const std::shared_ptr<const ProbeSet>& set, int32_t bucket) {
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

void StreamSlot::DropStaleGraphs() {
  graphs_.EraseIf([](const GraphKey&, const GraphEntry& e) { return e.probe_set.expired(); });
  PublishCounters();
}

// Readable from any thread (metrics scrapes), also while the worker runs.
GraphCacheCounters StreamSlot::counters() const {
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
void StreamSlot::PublishCounters() {
  entries_.store(graphs_.size(), std::memory_order_relaxed);
  hits_.store(graphs_.hits(), std::memory_order_relaxed);
  misses_.store(graphs_.misses(), std::memory_order_relaxed);
  evictions_.store(graphs_.evictions(), std::memory_order_relaxed);
}

StreamSlot::GraphKey StreamSlot::KeyFor(const ProbeSet& set, common::DType dtype, int32_t bucket,
                                        bool inline_x, bool host_out, bool timed) const {
  return GraphKey{
      set.id,   kernels::ChooseProbeScorePath(bucket, set.num_probes, set.hidden, dtype),
      dtype,    bucket,
      inline_x, host_out,
      timed};
}

// Grows the staging that a graph of `key` copies through. Growing drops the cached graphs, so
// this comes before GraphFor.
cudaError_t StreamSlot::ReserveFor(const GraphKey& key, int32_t hidden, int32_t probes) {
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
absl::StatusOr<StreamSlot::GraphEntry*> StreamSlot::GraphFor(
    const GraphKey& key, const std::shared_ptr<const ProbeSet>& set) {
  GraphEntry* entry = graphs_.Find(key);
  if (entry == nullptr) {
    const auto* weights = static_cast<const kernels::ProbeWeights*>(set->backend_state.get());
    absl::StatusOr<cudaGraphExec_t> exec = Capture(key, *weights, set->activation);
    if (!exec.ok()) {
      PublishCounters();
      return exec.status();
    }
    entry = &graphs_.Insert(key, GraphEntry{*exec, set});
  }
  PublishCounters();
  return entry;
}

// Grows a pinned + device staging pair to at least `bytes`.
cudaError_t StreamSlot::Reserve(Staging& host, Staging& device, size_t bytes) {
  if (bytes <= device.bytes) return cudaSuccess;
  const size_t grown = Grown(bytes, device.bytes);
  graphs_.Clear();  // they hold the old addresses
  PublishCounters();
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

absl::StatusOr<cudaGraphExec_t> StreamSlot::Capture(const GraphKey& key,
                                                    const kernels::ProbeWeights& weights,
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

}  // namespace probesidecar::server
