#include "server/executors/cuda/score_runner.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/executors/cuda/cuda_status.h"
#include "server/executors/cuda/cuda_placement.h"
#include "server/executors/cuda/row_buckets.h"

namespace probesidecar::server {
ScoreRunner::ScoreRunner(StreamSlot* slot, const Config& config, std::atomic<int64_t>* device_bytes)
    : slot_(slot),
      device_(slot->device()),
      stream_(slot->stream()),
      max_bucket_(RowBucket(static_cast<int32_t>(config.max_rows))),
      timing_every_(config.gpu_timing_every),
      device_bytes_(device_bytes),
      h_rows_(StagingBuffer::Kind::kPinned, device_bytes),
      d_rows_staged_(StagingBuffer::Kind::kDevice, device_bytes),
      h_x_(StagingBuffer::Kind::kPinned, device_bytes),
      d_x_(StagingBuffer::Kind::kDevice, device_bytes),
      d_out_(StagingBuffer::Kind::kDevice, device_bytes),
      h_out_(StagingBuffer::Kind::kMapped, device_bytes),
      graphs_(config.graph_cache_entries) {}

ScoreRunner::~ScoreRunner() {
  cudaSetDevice(device_);
  slot_->QuiesceBy(absl::InfiniteFuture());  // nothing of this runner's may still be in flight
  graphs_.Clear();
  if (workspace_ != nullptr) kernels::DestroyProbeScoreWorkspace(workspace_);
  for (cudaEvent_t e : events_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  for (void* p : {static_cast<void*>(d_args_), static_cast<void*>(d_rows_),
                  static_cast<void*>(d_invalid_), static_cast<void*>(d_identity_rows_),
                  static_cast<void*>(d_count_scratch_), static_cast<void*>(d_non_finite_total_)}) {
    cudaFree(p);
  }
  for (StagingBuffer* b : {&h_rows_, &d_rows_staged_, &h_x_, &d_x_, &d_out_, &h_out_}) b->Free();
  for (void* p : {static_cast<void*>(h_invalid_), static_cast<void*>(h_non_finite_)}) {
    cudaFreeHost(p);
  }
}

absl::Status ScoreRunner::Init(const Config& config) {
  PS_RETURN_IF_CUDA(cudaSetDevice(device_));
  graphs_.SetStream(stream_);
  for (cudaEvent_t& e : events_) PS_RETURN_IF_CUDA(cudaEventCreate(&e));
  PS_RETURN_IF_CUDA(cudaMalloc(reinterpret_cast<void**>(&d_args_), kernels::kMaxStagedArgsBytes));
  PS_RETURN_IF_CUDA(cudaMalloc(reinterpret_cast<void**>(&d_rows_), sizeof(int32_t) * max_bucket_));
  PS_RETURN_IF_CUDA(cudaMalloc(reinterpret_cast<void**>(&d_invalid_), max_bucket_));
  PS_RETURN_IF_CUDA(
      cudaMalloc(reinterpret_cast<void**>(&d_identity_rows_), sizeof(int32_t) * max_bucket_));
  std::vector<int32_t> identity(max_bucket_);
  for (int32_t i = 0; i < max_bucket_; ++i) identity[i] = i;
  PS_RETURN_IF_CUDA(cudaMemcpy(d_identity_rows_, identity.data(), sizeof(int32_t) * max_bucket_,
                               cudaMemcpyHostToDevice));
  PS_RETURN_IF_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&h_invalid_), 2 * sizeof(uint32_t),
                                  cudaHostAllocMapped));
  h_invalid_[0] = h_invalid_[1] = 0;
  PS_RETURN_IF_CUDA(
      cudaHostGetDevicePointer(reinterpret_cast<void**>(&d_invalid_alias_), h_invalid_, 0));
  PS_RETURN_IF_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&h_non_finite_), sizeof(uint32_t),
                                  cudaHostAllocMapped));
  h_non_finite_[0] = 0;
  PS_RETURN_IF_CUDA(
      cudaHostGetDevicePointer(reinterpret_cast<void**>(&d_non_finite_alias_), h_non_finite_, 0));
  PS_RETURN_IF_CUDA(cudaMalloc(reinterpret_cast<void**>(&d_count_scratch_), 2 * sizeof(uint32_t)));
  PS_RETURN_IF_CUDA(cudaMemset(d_count_scratch_, 0, 2 * sizeof(uint32_t)));
  PS_RETURN_IF_CUDA(
      cudaMalloc(reinterpret_cast<void**>(&d_non_finite_total_), sizeof(unsigned long long)));
  PS_RETURN_IF_CUDA(cudaMemset(d_non_finite_total_, 0, sizeof(unsigned long long)));
  stage_ = std::make_unique<kernels::StageRequestParams>();
  // Asked here, outside any capture: the outcome count then follows the scoring kernels as their
  // programmatic dependent where it can (its launch overlaps their last wave), in launch shapes
  // of up to kProgrammaticCountMaxScores scores.
  outcome_launch_ = kernels::CountCanFollowProgrammatically()
                        ? kernels::OutcomeLaunch::kProgrammatic
                        : kernels::OutcomeLaunch::kStreamOrder;
  kernels::ProbeScoreWorkspaceConfig ws;
  ws.max_rows = max_bucket_;
  ws.max_hidden = 65536;
  ws.max_probes = static_cast<int32_t>(config.max_probes);
  PS_RETURN_IF_CUDA(kernels::CreateProbeScoreWorkspace(ws, stream_, &workspace_));
  *device_bytes_ +=
      static_cast<int64_t>(kernels::kMaxStagedArgsBytes + (2 * sizeof(int32_t) + 1) * max_bucket_);
  return absl::OkStatus();
}

RowSource ScoreRunner::RowSourceOf(const ScoreJob& job) {
  if (!job.activations.on_device()) return RowSource::kIdentity;
  if (job.rows_on_device()) return RowSource::kDevice;
  return job.num_rows <= kernels::kMaxInlineRows ? RowSource::kParams : RowSource::kStaged;
}

absl::Status ScoreRunner::Run(const ScoreJob& job, ScoreTimings* timings, bool* enqueued) {
  *enqueued = false;
  const std::shared_ptr<const ProbeSet>& set = job.probe_set;
  PS_RETURN_IF_CUDA(cudaSetDevice(device_));
  const int32_t rows = job.num_rows;
  const int32_t bucket = RowBucket(rows);
  const int32_t hidden = set->hidden;
  const int32_t probes = set->num_probes;
  const common::DType dtype = job.activations.dtype;
  const int element = common::DTypeSize(dtype);
  const RowSource source = RowSourceOf(job);
  // Answer before the GPU runs only when nothing of the answer needs it, and nothing this request
  // reads from host memory can be overwritten by the next one (staged rows are).
  const bool async = job.enqueue_only && source != RowSource::kStaged;
  const bool timed = !async && timing_every_ > 0 && requests_++ % timing_every_ == 0;
  // Only a synchronous answer with a device output carries the GPU's non-finite count.
  const bool publish_non_finite = job.host_out == nullptr && !async;
  const GraphKey key{set->id, dtype,  bucket,
                     !job.activations.on_device(), source, timed,
                     set->count_outcomes || job.host_out != nullptr || publish_non_finite};
  PS_RETURN_IF_CUDA(ReserveFor(key, hidden));
  if (job.host_out != nullptr) {
    PS_RETURN_IF_CUDA(d_out_.Reserve(sizeof(float) * rows * probes));
    PS_RETURN_IF_CUDA(h_out_.Reserve(sizeof(float) * rows * probes));
  }
  // The counters of the request's label slot (allocated on the slot's first request).
  unsigned long long* counters = nullptr;
  const CudaPlacement* placed = set->PlacementAs<CudaPlacement>(device_);
  if (placed == nullptr) {
    return absl::InternalError(
        absl::StrCat("probe set '", set->name, "' is not placed on CUDA device ", device_));
  }
  if (set->count_outcomes) {
    absl::StatusOr<unsigned long long*> slot = placed->outcomes->Slot(job.outcome_slot, stream_);
    if (!slot.ok()) return slot.status();
    counters = *slot;
  }
  if (key.inline_x) {
    // Only the selected rows travel: gathered here into [R, H], read back with identity rows.
    const auto* src = static_cast<const char*>(job.activations.host);
    auto* dst = static_cast<char*>(h_x_.ptr());
    const size_t row_bytes = static_cast<size_t>(hidden) * element;
    for (int32_t r = 0; r < rows; ++r) {
      std::memcpy(dst + r * row_bytes,
                  src + static_cast<size_t>(job.rows[r]) * job.activations.row_stride * element,
                  row_bytes);
    }
  } else if (source == RowSource::kStaged) {
    PS_RETURN_IF_CUDA(h_rows_.Reserve(sizeof(int32_t) * rows));
    PS_RETURN_IF_CUDA(d_rows_staged_.Reserve(sizeof(int32_t) * rows));
    std::memcpy(h_rows_.ptr(), job.rows, sizeof(int32_t) * rows);
  }
  FillStageParams(job, key, counters, publish_non_finite);
  absl::StatusOr<GraphEntry*> entry = GraphFor(key, set);
  if (!entry.ok()) return entry.status();
  timings->kernel_path = kernels::ProbeScorePathName((*entry)->path);
  void* pointer_storage[1];
  cudaKernelNodeParams node;
  PS_RETURN_IF_CUDA(kernels::StageRequestNodeParams(stage_.get(), pointer_storage, &node));
  PS_RETURN_IF_CUDA(cudaGraphExecKernelNodeSetParams((*entry)->exec, (*entry)->stage_node, &node));

  if (absl::Status s = slot_->AwaitClientEvent(job.ready, job.lifetime); !s.ok()) return s;
  if (source == RowSource::kStaged) {
    PS_RETURN_IF_CUDA(cudaMemcpyAsync(d_rows_staged_.ptr(), h_rows_.ptr(), sizeof(int32_t) * rows,
                                      cudaMemcpyHostToDevice, stream_));
  }
  PS_RETURN_IF_CUDA(cudaGraphLaunch((*entry)->exec, stream_));
  if (absl::Status s = slot_->SignalClientEvent(job.done); !s.ok()) return s;
  // What the GPU reads and writes for this request, kept open until it is done whenever the
  // answer comes first.
  StreamSlot::GpuLeases leases = {set,
                                  job.activations.device.hold,
                                  job.device_rows.device.hold,
                                  job.counted_rows.device.hold,
                                  job.device_out.device.hold,
                                  job.ready.hold,
                                  job.done.hold};
  if (async) {
    // The GPU reads the caller's buffers after we answer: keep them (and the weights) open.
    if (absl::Status s = slot_->ReleaseWhenDone(std::move(leases)); !s.ok()) return s;
    *enqueued = true;
    return absl::OkStatus();
  }
  // (The done event, if any, follows the graph: waiting for the stream covers it too.) The wait
  // ends at the deadline even where the stream still waits for the client's ready event.
  if (absl::Status s = slot_->FinishOnGpu(job.lifetime, std::move(leases)); !s.ok()) return s;
  if (key.timed) {
    float staged_ms = 0, kernel_ms = 0;
    PS_RETURN_IF_CUDA(cudaEventElapsedTime(&staged_ms, events_[0], events_[1]));
    PS_RETURN_IF_CUDA(cudaEventElapsedTime(&kernel_ms, events_[1], events_[2]));
    timings->staging = staged_ms * 1e-3;
    timings->kernel = kernel_ms * 1e-3;
  }
  if (job.host_out == nullptr) {
    timings->device_non_finite = reinterpret_cast<volatile uint32_t*>(h_non_finite_)[0];
  }
  if (source == RowSource::kDevice) {
    const uint32_t invalid = reinterpret_cast<volatile uint32_t*>(h_invalid_)[1];
    if (invalid != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "device_rows: ", invalid, " of the ", rows, " row indices are outside the activations' ",
          job.activations.rows, " rows [0, ", job.activations.rows,
          "); their scores are NaN, the others are valid"));
    }
  }
  if (job.host_out != nullptr) {
    std::memcpy(job.host_out, h_out_.ptr(), sizeof(float) * rows * probes);
  }
  return absl::OkStatus();
}

void ScoreRunner::FillStageParams(const ScoreJob& job, const GraphKey& key,
                                  unsigned long long* counters, bool publish_non_finite) {
  kernels::StageRequestParams& stage = *stage_;
  stage.args_dst = d_args_;
  stage.rows_dst = key.rows == RowSource::kIdentity ? nullptr : d_rows_;
  stage.invalid_dst = d_invalid_;
  stage.invalid_counts = d_invalid_alias_;
  stage.num_tokens = job.activations.rows;
  stage.num_rows = job.num_rows;
  stage.bucket = key.bucket;
  stage.args_bytes = sizeof(StagedArgs);
  StagedArgs args;
  args.score.num_rows = job.num_rows;
  if (key.inline_x) {
    args.score.x = d_x_.ptr();
    args.score.x_row_stride = job.probe_set->hidden;
  } else {
    args.score.x = job.activations.device.device_ptr;
    args.score.x_row_stride = job.activations.row_stride;
  }
  if (job.host_out != nullptr) {
    args.score.out = static_cast<float*>(d_out_.ptr());
    args.score.out_row_stride = job.probe_set->num_probes;
  } else {
    args.score.out = static_cast<float*>(job.device_out.device.device_ptr);
    args.score.out_row_stride = job.device_out.row_stride;
  }
  args.poison =
      kernels::PoisonDescriptor{args.score.out, args.score.out_row_stride, job.num_rows, 0};
  // Every score of a counted set is counted on the GPU; scores bound for the response are copied
  // to the host as they are read (the running non-finite total takes device outputs only: the
  // host counts the scores it returns, as it reads them for `fired` anyway).
  args.outcomes.scores = args.score.out;
  args.outcomes.scores_row_stride = args.score.out_row_stride;
  if (job.host_out != nullptr) {
    args.outcomes.copy_to = static_cast<float*>(h_out_.device_alias());
    args.outcomes.copy_row_stride = job.probe_set->num_probes;
  }
  args.outcomes.counters = counters;
  if (job.counted_rows.size > 0) {
    args.outcomes.group_counts = static_cast<const int32_t*>(job.counted_rows.device.device_ptr);
    args.outcomes.group_rows = static_cast<int32_t>(job.num_rows / job.counted_rows.size);
  }
  args.outcomes.num_rows = job.num_rows;
  args.outcomes.add_to_total = job.host_out == nullptr && job.probe_set->count_outcomes ? 1 : 0;
  args.outcomes.publish_count = publish_non_finite ? 1 : 0;
  std::memcpy(stage.args, &args, sizeof(args));
  stage.device_rows = nullptr;
  switch (key.rows) {
    case RowSource::kParams:
      std::memcpy(stage.inline_rows, job.rows, sizeof(int32_t) * job.num_rows);
      break;
    case RowSource::kStaged:
      stage.device_rows = static_cast<const int32_t*>(d_rows_staged_.ptr());
      break;
    case RowSource::kDevice:
      stage.device_rows = static_cast<const int32_t*>(job.device_rows.device.device_ptr);
      break;
    case RowSource::kIdentity:
      break;
  }
}

absl::Status ScoreRunner::Warmup(const std::shared_ptr<const ProbeSet>& set, int32_t bucket) {
  PS_RETURN_IF_CUDA(cudaSetDevice(device_));
  bucket = RowBucket(std::min(bucket, max_bucket_));
  const RowSource host_rows =
      bucket <= kernels::kMaxInlineRows ? RowSource::kParams : RowSource::kStaged;
  for (bool inline_x : {true, false}) {
    const GraphKey key{set->id,
                       common::DType::kBFloat16,
                       bucket,
                       inline_x,
                       inline_x ? RowSource::kIdentity : host_rows,
                       timing_every_ > 0};
    PS_RETURN_IF_CUDA(ReserveFor(key, set->hidden));
    absl::StatusOr<GraphEntry*> entry = GraphFor(key, set);
    if (!entry.ok()) return entry.status();
  }
  return absl::OkStatus();
}

GraphCacheCounters ScoreRunner::counters() const { return graphs_.counters(); }

uint64_t ScoreRunner::invalid_rows() const {
  return h_invalid_ == nullptr ? 0 : reinterpret_cast<const volatile uint32_t*>(h_invalid_)[0];
}

uint64_t ScoreRunner::non_finite_scores() const {
  return non_finite_copied_.load(std::memory_order_relaxed);
}

cudaError_t ScoreRunner::CopyNonFiniteTotal(uint64_t* host, cudaStream_t stream) const {
  if (d_non_finite_total_ == nullptr) {
    *host = 0;
    return cudaSuccess;
  }
  return cudaMemcpyAsync(host, d_non_finite_total_, sizeof(uint64_t), cudaMemcpyDeviceToHost,
                         stream);
}

cudaError_t ScoreRunner::ReserveFor(const GraphKey& key, int32_t hidden) {
  if (!key.inline_x) return cudaSuccess;
  const size_t bytes = size_t{1} * key.bucket * hidden * common::DTypeSize(key.dtype);
  if (bytes <= d_x_.bytes() && bytes <= h_x_.bytes()) return cudaSuccess;
  graphs_.Clear();  // their copy nodes hold the old addresses
  cudaError_t e = h_x_.Reserve(bytes);
  return e == cudaSuccess ? d_x_.Reserve(bytes) : e;
}

absl::StatusOr<GraphEntry*> ScoreRunner::GraphFor(const GraphKey& key,
                                                  const std::shared_ptr<const ProbeSet>& set) {
  return graphs_.FindOrCapture(key, set, [&] { return Capture(key, *set); });
}

}  // namespace probesidecar::server
