// ScoreRunner::Capture: the one CUDA graph of a shape (staging, the scoring path, the invalid-row
// poison, the outcome count), captured once and replayed by every request of that shape.
#include "server/executors/cuda/score_runner.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "server/executors/cuda/cuda_placement.h"
#include "server/executors/cuda/cuda_status.h"

namespace probesidecar::server {

absl::StatusOr<GraphEntry> ScoreRunner::Capture(const GraphKey& key, const ProbeSet& set) {
  const CudaPlacement* placed = set.PlacementAs<CudaPlacement>(device_);
  if (placed == nullptr) {
    return absl::InternalError(
        absl::StrCat("probe set '", set.name, "' is not placed on CUDA device ", device_));
  }
  const kernels::ProbeWeights& weights = *placed->weights;
  const DeviceOutcomeCounters& outcomes = *placed->outcomes;
  // The path and its launch plan are chosen once here; every replay runs them.
  const kernels::ProbeScoreShape shape{key.dtype, key.bucket, set.num_probes, set.hidden,
                                       set.precision};
  const kernels::ProbeScoreResources& resources =
      kernels::ProbeScoreWorkspaceResources(*workspace_);
  GraphEntry entry;
  entry.path = kernels::ChooseProbeScorePath(shape, resources.device);
  kernels::ProbeScorePlan plan;
  PS_RETURN_IF_CUDA(kernels::PlanProbeScore(shape, entry.path, resources, {}, &plan));
  kernels::ProbeScoreParams params;
  params.args = &d_args_->score;
  params.rows = key.rows == RowSource::kIdentity ? d_identity_rows_ : d_rows_;
  params.weights = &weights;
  params.activation = set.activation;
  // The staging node is captured with an empty request (not the slot's stage_, which holds the
  // request being run); every launch sets its parameters.
  auto capture_stage = std::make_unique<kernels::StageRequestParams>();
  kernels::StageRequestParams& stage = *capture_stage;
  stage.args_dst = d_args_;
  stage.rows_dst = key.rows == RowSource::kIdentity ? nullptr : d_rows_;
  stage.bucket = key.bucket;
  const int element = common::DTypeSize(key.dtype);

  // Event nodes mark the stage boundaries of timed graphs.
  auto mark = [&](int i) {
    return key.timed ? cudaEventRecordWithFlags(events_[i], stream_, cudaEventRecordExternal)
                     : cudaSuccess;
  };
  PS_RETURN_IF_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  cudaError_t error = mark(0);
  if (error == cudaSuccess) error = kernels::LaunchStageRequest(stage, stream_);
  if (error == cudaSuccess) {
    // The node just captured is the staging kernel's: every launch updates its parameters.
    cudaStreamCaptureStatus capture_status;
    const cudaGraphNode_t* last = nullptr;
    size_t count = 0;
    error = cudaStreamGetCaptureInfo(stream_, &capture_status, nullptr, nullptr, &last, nullptr,
                                     &count);
    if (error == cudaSuccess && count == 1) entry.stage_node = last[0];
  }
  if (error == cudaSuccess && key.inline_x) {
    error = cudaMemcpyAsync(d_x_.ptr(), h_x_.ptr(), size_t{1} * key.bucket * set.hidden * element,
                            cudaMemcpyHostToDevice, stream_);
  }
  if (error == cudaSuccess) error = mark(1);
  if (error == cudaSuccess) {
    error = kernels::LaunchProbeScore(plan, params, workspace_, stream_);
  }
  if (error == cudaSuccess && key.rows == RowSource::kDevice) {
    kernels::PoisonInvalidRowsParams poison;
    poison.descriptor = &d_args_->poison;
    poison.invalid = d_invalid_;
    poison.bucket = key.bucket;
    poison.num_columns = weights.num_probes;
    error = kernels::LaunchPoisonInvalidRows(poison, stream_);
  }
  if (error == cudaSuccess && key.count) {
    // What the probes found is counted on the GPU, in this graph, whatever path scored: into the
    // counters the staged descriptor names (the request's label slot); the request's non-finite
    // count comes back in mapped host memory.
    kernels::CountProbeOutcomesParams count;
    count.descriptor = &d_args_->outcomes;
    count.thresholds = outcomes.tables().thresholds;
    count.bounds = outcomes.tables().bounds;
    count.num_probes = weights.num_probes;
    count.num_bounds = outcomes.layout().num_bounds;
    count.bucket = key.bucket;
    count.scratch = d_count_scratch_;
    count.non_finite_total = d_non_finite_total_;
    count.request_non_finite = d_non_finite_alias_;
    const bool small =
        int64_t{key.bucket} * weights.num_probes <= kernels::kProgrammaticCountMaxScores;
    error = kernels::LaunchCountProbeOutcomes(
        count, stream_, small ? outcome_launch_ : kernels::OutcomeLaunch::kStreamOrder);
  }
  if (error == cudaSuccess) error = mark(2);
  const cudaError_t end = cudaStreamEndCapture(stream_, &entry.graph);
  if (error == cudaSuccess) error = end;
  if (error == cudaSuccess && entry.stage_node == nullptr)
    error = cudaErrorStreamCaptureInvalidated;
  if (error == cudaSuccess) error = cudaGraphInstantiate(&entry.exec, entry.graph, 0);
  if (error != cudaSuccess) {
    cudaGetLastError();
    if (entry.exec != nullptr) cudaGraphExecDestroy(entry.exec);
    if (entry.graph != nullptr) cudaGraphDestroy(entry.graph);
    return CudaStatus(
        error, absl::StrCat("capturing the ", kernels::ProbeScorePathName(entry.path), " graph"));
  }
  return entry;
}

}  // namespace probesidecar::server
