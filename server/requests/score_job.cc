#include "server/requests/score_job.h"

#include "absl/strings/str_cat.h"
#include "common/safetensors.h"

namespace probesidecar::server {

absl::StatusOr<ScoreJob> PrepareScoreJob(const v1::ScoreRequest& request,
                                         const ProbeRegistry& probes, BufferResolver* buffers,
                                         const ScoreLimits& limits, std::string* scores) {
  ScoreJob job;
  if (request.probe_set().empty()) {
    return absl::InvalidArgumentError("probe_set: empty; name a loaded probe set");
  }
  job.probe_set = probes.Find(request.probe_set());
  if (job.probe_set == nullptr) {
    // The name is the caller's: quoted, escaped and cut, so that a hostile one cannot forge log
    // lines or outgrow the response's metadata.
    return absl::NotFoundError(absl::StrCat("probe set ",
                                            common::QuoteForMessage(request.probe_set()),
                                            " is not loaded (see ListProbeSets)"));
  }
  const ProbeSet& set = *job.probe_set;

  const bool device_rows = request.has_device_rows();
  if (device_rows && request.rows_size() > 0) {
    return absl::InvalidArgumentError(
        "rows: name the rows in `rows` or in `device_rows`, not both");
  }
  const int64_t num_rows =
      device_rows ? request.device_rows().shape_size() == 1 ? request.device_rows().shape(0) : 0
                  : request.rows_size();
  if (!device_rows) {
    if (num_rows == 0) return absl::InvalidArgumentError("rows: empty; name at least one row");
    if (num_rows > limits.max_rows) {
      return absl::ResourceExhaustedError(absl::StrCat("rows: ", num_rows,
                                                       " rows is over this server's limit of ",
                                                       limits.max_rows, " (--max-rows)"));
    }
  }
  if (!request.has_activations()) {
    return absl::InvalidArgumentError("activations: missing");
  }
  absl::StatusOr<Tensor2D> activations =
      ResolveTensor2D(request.activations(), "activations", buffers, request.session_id());
  if (!activations.ok()) return activations.status();
  job.activations = std::move(*activations);
  if (job.activations.cols != set.hidden) {
    return absl::InvalidArgumentError(
        absl::StrCat("activations: hidden size ", job.activations.cols,
                     " does not match probe set '", set.name, "', which expects ", set.hidden));
  }
  if (device_rows) {
    if (!job.activations.on_device()) {
      return absl::InvalidArgumentError(
          "device_rows: rows on the device need activations in a registered buffer too");
    }
    absl::StatusOr<DeviceInt32Vector> rows = ResolveDeviceInt32Vector(
        request.device_rows(), "device_rows", buffers, request.session_id(), limits.max_rows);
    if (!rows.ok()) return rows.status();
    job.device_rows = std::move(*rows);
  } else {
    const int64_t num_tokens = job.activations.rows;
    for (int64_t i = 0; i < num_rows; ++i) {
      const int32_t row = request.rows(static_cast<int>(i));
      if (row < 0 || row >= num_tokens) {
        return absl::InvalidArgumentError(absl::StrCat("rows[", i, "] = ", row,
                                                       " is outside the activations' ", num_tokens,
                                                       " rows [0, ", num_tokens, ")"));
      }
    }
    job.rows = request.rows().data();
  }
  job.num_rows = static_cast<int32_t>(num_rows);
  if (request.has_counted_rows()) {
    absl::StatusOr<DeviceInt32Vector> counted = ResolveDeviceInt32Vector(
        request.counted_rows(), "counted_rows", buffers, request.session_id(), limits.max_rows);
    if (!counted.ok()) return counted.status();
    if (num_rows % counted->size != 0) {
      return absl::InvalidArgumentError(absl::StrCat("counted_rows: its ", counted->size,
                                                     " groups do not divide the ", num_rows,
                                                     " rows (R must be a multiple of G)"));
    }
    job.counted_rows = std::move(*counted);
  }

  const uint64_t score_bytes = static_cast<uint64_t>(num_rows) * set.num_probes * sizeof(float);
  if (request.has_output()) {
    const v1::TensorRef& out = request.output();
    if (out.location_case() != v1::TensorRef::kBuffer) {
      return absl::InvalidArgumentError(
          "output: must name a registered buffer (leave it unset to get scores inline)");
    }
    if (out.dtype() != v1::DTYPE_FLOAT32) {
      return absl::InvalidArgumentError("output: dtype must be DTYPE_FLOAT32");
    }
    if (out.shape_size() != 2 || out.shape(0) != num_rows || out.shape(1) != set.num_probes) {
      return absl::InvalidArgumentError(
          absl::StrCat("output: shape must be [R, P] = [", num_rows, ", ", set.num_probes, "]"));
    }
    absl::StatusOr<Tensor2D> device_out =
        ResolveTensor2D(out, "output", buffers, request.session_id());
    if (!device_out.ok()) return device_out.status();
    job.device_out = std::move(*device_out);
    scores->clear();
  } else {
    // The response also carries fired indices and small fields; keep headroom for them.
    if (score_bytes + 1024 > limits.max_message_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "scores: ", num_rows, " x ", set.num_probes, " float32 scores are ", score_bytes,
          " bytes, over the ", limits.max_message_bytes,
          "-byte message limit (--max-message-bytes); use fewer rows or an output buffer"));
    }
    scores->resize(score_bytes);
    job.host_out = reinterpret_cast<float*>(scores->data());
  }

  // GPU-side ordering.
  if (absl::Status s = ResolveOrderingEvents(request.ready_event(), request.done_event(),
                                             request.session_id(), buffers, &job.ready, &job.done);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::optional<int>> device = OneDevice({
      {"activations", job.activations.on_device(), job.activations.device.device},
      {"device_rows", job.rows_on_device(), job.device_rows.device.device},
      {"counted_rows", job.counted_rows.size > 0, job.counted_rows.device.device},
      {"output", job.host_out == nullptr, job.device_out.device.device},
      {"ready_event", job.ready.event != nullptr, job.ready.device},
      {"done_event", job.done.event != nullptr, job.done.device},
  });
  if (!device.ok()) return device.status();
  job.device = *device;
  job.enqueue_only =
      job.done.event != nullptr && job.activations.on_device() && job.host_out == nullptr;
  return job;
}

}  // namespace probesidecar::server
