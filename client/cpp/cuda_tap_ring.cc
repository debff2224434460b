// The CUDA tap's ring (Tap::Create): hidden rows, scores and the tap's counters in one cudaMalloc
// allocation of its own (kernels/tap_write's TapRingLayout), registered with the sidecar by CUDA
// IPC, written on the GPU by the capturable write kernel, ordered against the sidecar by CUDA IPC
// events: per half, a ready event recorded on the decode stream after the window's close, and a
// done event the sidecar records once the scores are written.
//
// Ordering: the sidecar's stream waits for ready[h] before it reads the half; before the decode
// stream writes half h again the host checks (polls, up to the reuse timeout) that the last thing
// that reads it has finished — done[h] of its previous window, or, with host results, the event
// after the delivery stream's copy of the scores (which itself follows done[h]). The decode
// stream itself never waits on the GPU for the sidecar: a sidecar that dies or hangs with a
// record queued could otherwise hold the inference server's stream forever.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cpp/cuda_buffer.h"
#include "client/cpp/score_pipeline.h"
#include "client/cpp/tap.h"
#include "common/dtype.h"
#include "kernels/tap_write/tap_write.h"
#include "proto/dtype_mapping.h"

namespace probesidecar::client {
namespace {

// Host copies of the scores in flight: an answer waits for a free one only when the delivery
// thread is this many windows behind.
constexpr int kHostSlots = 4;
// Timing events (closed, scored, copied) per window index mod kTimingSets. Window w's are read by
// its Fetch and recorded again at the close of window w + 8, which comes after the answer to
// window w + 6 (the close of w + 7 waited for it); that answer's copy took host slot (w + 6) mod 4,
// which only the Fetch of window w + 2 frees, and the delivery thread fetches in order.
constexpr int kTimingSets = 2 * kHostSlots;

absl::Status Cuda(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(error)));
}

#define RETURN_IF_CUDA_ERROR(call, what)                              \
  do {                                                                \
    if (absl::Status status_ = Cuda((call), (what)); !status_.ok()) { \
      return status_;                                                 \
    }                                                                 \
  } while (0)

// Makes `device` current for the scope (the tap's threads, and a decode thread on another
// device).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != device) {
      switched_ = cudaSetDevice(device) == cudaSuccess;
    }
  }
  ~DeviceGuard() {
    if (switched_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

absl::StatusOr<common::DType> RowType(v1::DType dtype) {
  if (const std::optional<common::DType> known = DTypeFromProto(dtype)) return *known;
  return absl::InvalidArgumentError(
      absl::StrCat("a tap's dtype must be DTYPE_BFLOAT16, DTYPE_FLOAT16 or DTYPE_FLOAT32, got ",
                   v1::DType_Name(dtype)));
}

class CudaTapRing final : public TapRing {
 public:
  static absl::StatusOr<std::unique_ptr<CudaTapRing>> Create(Client& client, uint64_t session_id,
                                                             const v1::ProbeSetInfo& info,
                                                             const TapOptions& options, int device);
  ~CudaTapRing() override { Release().IgnoreError(); }

  absl::Status Write(const TapRows& rows) override;
  absl::StatusOr<v1::ScoreRequest> CloseWindow(const Window& window) override;
  absl::Status ReadyWait(const Window& window) override;
  absl::Status BeforeReuse(const Window& window) override;
  absl::Status Answered(const Window& window, bool copy_scores) override;
  absl::Status Fetch(const Window& window, Fetched* out) override;
  absl::StatusOr<const float*> DeviceScores(const Window& window, cudaStream_t stream) override;
  absl::Status Release() override;

 private:
  CudaTapRing(Client& client, uint64_t session_id, const v1::ProbeSetInfo& info,
              const TapOptions& options, int device, common::DType dtype)
      : client_(client),
        session_id_(session_id),
        probe_set_(info.name()),
        device_(device),
        stream_(options.stream),
        window_(options.window),
        max_batch_(options.max_batch),
        hidden_(info.hidden_size()),
        num_probes_(info.num_probes()),
        dtype_(dtype),
        proto_dtype_(options.dtype),
        submit_from_host_(options.submit == TapSubmit::kHost),
        reuse_timeout_(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::duration<double>(options.reuse_timeout_seconds))),
        layout_(kernels::MakeTapRingLayout(window_, max_batch_, hidden_, num_probes_, dtype)),
        host_scores_(int64_t{window_} * max_batch_ * num_probes_),
        host_slot_bytes_(host_scores_ * 4 + int64_t{window_} * 4 + 8) {}

  absl::Status Init();
  absl::Status WarmServer();
  absl::Status PollEvent(cudaEvent_t event, int64_t index, const char* what);
  // Where the protocol puts a window's parts (docs/tap-protocol.md).
  kernels::TapWindowParts Parts(int32_t half, int32_t steps) const {
    return kernels::MakeTapWindowParts(layout_, half, steps);
  }
  uint8_t* HalfScores(int32_t half) const { return base_ + Parts(half, 1).scores; }
  uint8_t* HostSlot(int slot) const { return host_ + slot * host_slot_bytes_; }
  absl::Status QueueCopy(const Window& window, int slot);
  void FreeHostSlot(int slot);
  const v1::ScoreRequest& Request(int32_t half, int32_t steps);

  Client& client_;
  const uint64_t session_id_;
  const std::string probe_set_;
  const int device_;
  const cudaStream_t stream_;
  const int32_t window_, max_batch_, hidden_, num_probes_;
  const common::DType dtype_;
  const v1::DType proto_dtype_;
  const bool submit_from_host_;
  const std::chrono::steady_clock::duration reuse_timeout_;
  const kernels::TapRingLayout layout_;
  const int64_t host_scores_;      // floats of one window's scores
  const int64_t host_slot_bytes_;  // scores, then counts [K] int32, then the write count int64

  uint8_t* base_ = nullptr;
  uint64_t buffer_id_ = 0;
  IpcEvent ready_[2], done_[2];
  cudaEvent_t ready_host_[2] = {};  // TapSubmit::kHost: blocking, for the submit thread
  cudaStream_t delivery_ = nullptr;
  uint8_t* host_ = nullptr;  // pinned, kHostSlots x host_slot_bytes_
  cudaEvent_t copied_[kHostSlots] = {};
  cudaEvent_t timing_[kTimingSets][3] = {};  // closed, scored, copied
  // Per half: what the next writes into it must follow (set by CloseWindow and Answered of the
  // half's window, read by its BeforeReuse once it has settled).
  cudaEvent_t reuse_after_[2] = {};
  kernels::TapWriteParams write_;  // the fixed part of every write
  std::map<std::pair<int32_t, int32_t>, v1::ScoreRequest> requests_;  // (half, steps)

  std::mutex host_mu_;
  std::condition_variable host_cv_;
  bool host_busy_[kHostSlots] = {};
};

absl::StatusOr<std::unique_ptr<CudaTapRing>> CudaTapRing::Create(Client& client,
                                                                 uint64_t session_id,
                                                                 const v1::ProbeSetInfo& info,
                                                                 const TapOptions& options,
                                                                 int device) {
  absl::StatusOr<common::DType> dtype = RowType(options.dtype);
  if (!dtype.ok()) return dtype.status();
  std::unique_ptr<CudaTapRing> ring(
      new CudaTapRing(client, session_id, info, options, device, *dtype));
  if (absl::Status s = ring->Init(); !s.ok()) return s;  // the destructor gives back the rest
  return ring;
}

absl::Status CudaTapRing::Init() {
  DeviceGuard guard(device_);
  RETURN_IF_CUDA_ERROR(kernels::PrepareTapKernels(), "loading the tap kernels");
  void* base = nullptr;
  RETURN_IF_CUDA_ERROR(cudaMalloc(&base, layout_.total_bytes),
                       absl::StrCat("cudaMalloc(", layout_.total_bytes, " bytes)"));
  base_ = static_cast<uint8_t*>(base);
  // Rows 0, 1, ... of every window; counts and gather 0; the counters at half 0; scores NaN until
  // written (docs/tap-protocol.md: a new ring).
  std::vector<int32_t> rows(int64_t{window_} * max_batch_);
  std::iota(rows.begin(), rows.end(), 0);
  const std::vector<int32_t> counts(2 * window_ + 1, 0);
  const std::array<int64_t, kernels::kTapMetaSize> meta = kernels::TapInitialMeta(window_);
  // On the decode stream, so that its first write follows them.
  RETURN_IF_CUDA_ERROR(
      cudaMemsetAsync(base_ + layout_.scores, 0xff,
                      int64_t{2} * window_ * max_batch_ * num_probes_ * 4, stream_),
      "cudaMemsetAsync");
  RETURN_IF_CUDA_ERROR(cudaMemsetAsync(base_ + layout_.gather, 0, int64_t{max_batch_} * 4, stream_),
                       "cudaMemsetAsync");
  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(base_ + layout_.rows, rows.data(), rows.size() * 4,
                                       cudaMemcpyHostToDevice, stream_),
                       "cudaMemcpyAsync");
  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(base_ + layout_.counts, counts.data(), counts.size() * 4,
                                       cudaMemcpyHostToDevice, stream_),
                       "cudaMemcpyAsync");
  RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(base_ + layout_.meta, meta.data(), sizeof(meta), cudaMemcpyHostToDevice,
                      stream_),
      "cudaMemcpyAsync");
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  absl::StatusOr<v1::RegisterBufferResponse> registered = RegisterDeviceMemory(
      client_, base_, layout_.total_bytes, absl::StrCat("tap:", probe_set_), session_id_);
  if (!registered.ok()) return registered.status();
  buffer_id_ = registered->buffer_id();
  for (int half = 0; half < 2; ++half) {
    absl::StatusOr<IpcEvent> ready = CreateIpcEvent(client_, session_id_, "tap-ready");
    if (!ready.ok()) return ready.status();
    ready_[half] = *ready;
    absl::StatusOr<IpcEvent> done = CreateIpcEvent(client_, session_id_, "tap-done");
    if (!done.ok()) return done.status();
    done_[half] = *done;
    reuse_after_[half] = done_[half].event;
  }
  RETURN_IF_CUDA_ERROR(cudaStreamCreateWithFlags(&delivery_, cudaStreamNonBlocking),
                       "cudaStreamCreateWithFlags");
  void* host = nullptr;
  RETURN_IF_CUDA_ERROR(cudaHostAlloc(&host, kHostSlots * host_slot_bytes_, 0), "cudaHostAlloc");
  host_ = static_cast<uint8_t*>(host);
  for (cudaEvent_t& event : copied_) {
    // Blocking: the delivery thread sleeps in cudaEventSynchronize instead of spinning.
    RETURN_IF_CUDA_ERROR(
        cudaEventCreateWithFlags(&event, cudaEventBlockingSync | cudaEventDisableTiming),
        "cudaEventCreateWithFlags");
  }
  for (auto& set : timing_) {
    for (cudaEvent_t& event : set) {
      RETURN_IF_CUDA_ERROR(cudaEventCreate(&event), "cudaEventCreate");
    }
  }
  for (cudaEvent_t& event : ready_host_) {
    RETURN_IF_CUDA_ERROR(
        cudaEventCreateWithFlags(&event, cudaEventBlockingSync | cudaEventDisableTiming),
        "cudaEventCreateWithFlags");
  }
  write_ = kernels::TapRingWriteParams(layout_, base_);
  return WarmServer();
}

absl::Status CudaTapRing::WarmServer() {
  // One Score of a full window now, waited for: the sidecar captures the graph a window replays
  // before the loop's first window needs it (the scores it writes are overwritten later).
  RETURN_IF_CUDA_ERROR(cudaEventRecord(ready_[0].event, stream_), "cudaEventRecord");
  absl::StatusOr<v1::ScoreResponse> warmed = client_.Score(Request(0, window_));
  if (!warmed.ok()) {
    return absl::Status(warmed.status().code(),
                        absl::StrCat("the tap's first Score (a full window, made to warm the "
                                     "sidecar): ",
                                     warmed.status().message()));
  }
  RETURN_IF_CUDA_ERROR(cudaEventSynchronize(done_[0].event), "cudaEventSynchronize");
  return absl::OkStatus();
}

// --- the decode thread

absl::Status CudaTapRing::Write(const TapRows& rows) {
  DeviceGuard guard(device_);
  kernels::TapWriteParams p = write_;
  p.src = rows.data;
  p.src_row_stride = rows.row_stride;
  p.n = rows.n;
  p.num_rows32 = rows.device_num_rows32;
  p.num_rows64 = rows.device_num_rows64;
  const cudaError_t error = kernels::LaunchTapWrite(p, stream_);
  if (error == cudaErrorInvalidValue) {  // what the tap did not check already
    return absl::InvalidArgumentError(
        absl::StrCat("Write(): rows must be aligned to their element size (",
                     common::DTypeSize(dtype_), " bytes)"));
  }
  return Cuda(error, "the tap's write kernel");
}

absl::StatusOr<v1::ScoreRequest> CudaTapRing::CloseWindow(const Window& window) {
  DeviceGuard guard(device_);
  const int32_t half = window.half;
  const int64_t next_base = int64_t{1 - half} * window_;
  kernels::TapCloseParams close;
  close.meta = write_.meta;
  close.half = half;
  close.next_base = next_base;
  close.next_limit = next_base + window_;
  RETURN_IF_CUDA_ERROR(kernels::LaunchTapClose(close, stream_), "the tap's close kernel");
  RETURN_IF_CUDA_ERROR(cudaEventRecord(ready_[half].event, stream_), "cudaEventRecord");
  RETURN_IF_CUDA_ERROR(cudaEventRecord(timing_[window.index % kTimingSets][0], stream_),
                       "cudaEventRecord");
  if (submit_from_host_) {
    RETURN_IF_CUDA_ERROR(cudaEventRecord(ready_host_[half], stream_), "cudaEventRecord");
  }
  reuse_after_[half] = done_[half].event;
  return Request(half, window.steps);
}

const v1::ScoreRequest& CudaTapRing::Request(int32_t half, int32_t steps) {
  auto [it, made] = requests_.try_emplace({half, steps});
  v1::ScoreRequest& request = it->second;
  if (!made) return request;
  const kernels::TapWindowParts parts = Parts(half, steps);
  const int64_t rows = parts.rows;
  request.set_probe_set(probe_set_);
  request.set_session_id(session_id_);
  request.set_ready_event(ready_[half].event_id);
  request.set_done_event(done_[half].event_id);
  *request.mutable_activations() =
      BufferTensor(proto_dtype_, rows, hidden_, buffer_id_, parts.activations, hidden_);
  v1::TensorRef* device_rows = request.mutable_device_rows();
  device_rows->set_dtype(v1::DTYPE_INT32);
  device_rows->add_shape(rows);
  device_rows->mutable_buffer()->set_buffer_id(buffer_id_);
  device_rows->mutable_buffer()->set_offset_bytes(parts.device_rows);
  // Each step's rows past its row count are padding: the probe outcomes count only the rest.
  v1::TensorRef* counted = request.mutable_counted_rows();
  counted->set_dtype(v1::DTYPE_INT32);
  counted->add_shape(steps);
  counted->mutable_buffer()->set_buffer_id(buffer_id_);
  counted->mutable_buffer()->set_offset_bytes(parts.counts);
  *request.mutable_output() =
      BufferTensor(v1::DTYPE_FLOAT32, rows, num_probes_, buffer_id_, parts.scores, num_probes_);
  return request;
}

absl::Status CudaTapRing::ReadyWait(const Window& window) {
  DeviceGuard guard(device_);
  return Cuda(cudaEventSynchronize(ready_host_[window.half]), "cudaEventSynchronize");
}

absl::Status CudaTapRing::BeforeReuse(const Window& window) {
  DeviceGuard guard(device_);
  return PollEvent(reuse_after_[window.half], window.index, "finished");
}

// Polls `event` from the host (sleeping between polls) until it completes or reuse_timeout_
// passes: the decode stream never waits on the GPU for the sidecar.
absl::Status CudaTapRing::PollEvent(cudaEvent_t event, int64_t index, const char* what) {
  const auto deadline = std::chrono::steady_clock::now() + reuse_timeout_;
  auto pause = std::chrono::microseconds(20);
  for (;;) {
    const cudaError_t e = cudaEventQuery(event);
    if (e == cudaSuccess) return absl::OkStatus();
    if (e != cudaErrorNotReady) return Cuda(e, "cudaEventQuery");
    if (std::chrono::steady_clock::now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "window ", index, " not ", what, " by the sidecar within the reuse timeout (",
          std::chrono::duration<double>(reuse_timeout_).count(), " s)"));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

// --- the answer and delivery threads

absl::Status CudaTapRing::Answered(const Window& window, bool copy_scores) {
  if (!copy_scores) return absl::OkStatus();  // the half's next writes follow done[h]
  const int slot = static_cast<int>(window.index % kHostSlots);
  {
    std::unique_lock<std::mutex> lock(host_mu_);
    host_cv_.wait(lock, [&] { return !host_busy_[slot]; });  // freed by Fetch(index - 4)
    host_busy_[slot] = true;
  }
  absl::Status status = QueueCopy(window, slot);
  if (!status.ok()) FreeHostSlot(slot);
  return status;
}

absl::Status CudaTapRing::QueueCopy(const Window& window, int slot) {
  DeviceGuard guard(device_);
  const int32_t half = window.half, steps = window.steps;
  const kernels::TapWindowParts parts = Parts(half, steps);
  cudaEvent_t* timing = timing_[window.index % kTimingSets];
  uint8_t* host = HostSlot(slot);
  const int64_t score_bytes = int64_t{steps} * max_batch_ * num_probes_ * 4;
  RETURN_IF_CUDA_ERROR(cudaStreamWaitEvent(delivery_, done_[half].event, 0), "cudaStreamWaitEvent");
  RETURN_IF_CUDA_ERROR(cudaEventRecord(timing[1], delivery_), "cudaEventRecord");
  RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(host, base_ + parts.scores, score_bytes, cudaMemcpyDeviceToHost, delivery_),
      "cudaMemcpyAsync");
  RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(host + host_scores_ * 4, base_ + parts.counts, int64_t{steps} * 4,
                      cudaMemcpyDeviceToHost, delivery_),
      "cudaMemcpyAsync");
  RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(host + host_scores_ * 4 + int64_t{window_} * 4, base_ + parts.writes, 8,
                      cudaMemcpyDeviceToHost, delivery_),
      "cudaMemcpyAsync");
  RETURN_IF_CUDA_ERROR(cudaEventRecord(timing[2], delivery_), "cudaEventRecord");
  RETURN_IF_CUDA_ERROR(cudaEventRecord(copied_[slot], delivery_), "cudaEventRecord");
  reuse_after_[half] = copied_[slot];
  return absl::OkStatus();
}

void CudaTapRing::FreeHostSlot(int slot) {
  {
    std::lock_guard<std::mutex> lock(host_mu_);
    host_busy_[slot] = false;
  }
  host_cv_.notify_all();
}

absl::Status CudaTapRing::Fetch(const Window& window, Fetched* out) {
  DeviceGuard guard(device_);
  const int slot = static_cast<int>(window.index % kHostSlots);
  absl::Status status = Cuda(cudaEventSynchronize(copied_[slot]), "cudaEventSynchronize");
  if (status.ok()) {
    const int32_t steps = window.steps;
    const uint8_t* host = HostSlot(slot);
    const auto* scores = reinterpret_cast<const float*>(host);
    out->scores.assign(scores, scores + int64_t{steps} * max_batch_ * num_probes_);
    const auto* counts = reinterpret_cast<const int32_t*>(host + host_scores_ * 4);
    out->num_rows.assign(counts, counts + steps);
    std::memcpy(&out->writes, host + host_scores_ * 4 + int64_t{window_} * 4, 8);
    cudaEvent_t* timing = timing_[window.index % kTimingSets];
    float ms = 0;
    if (cudaEventElapsedTime(&ms, timing[0], timing[1]) == cudaSuccess) {
      out->device_latency_s = std::max(ms, 0.0f) * 1e-3;
    }
    if (cudaEventElapsedTime(&ms, timing[0], timing[2]) == cudaSuccess) {
      out->host_memory_latency_s = std::max(ms, 0.0f) * 1e-3;
    }
    cudaGetLastError();  // a latency not measured is not an error of this thread's next call
  }
  FreeHostSlot(slot);
  return status;
}

absl::StatusOr<const float*> CudaTapRing::DeviceScores(const Window& window, cudaStream_t) {
  DeviceGuard guard(device_);
  if (absl::Status s = PollEvent(done_[window.half].event, window.index, "scored"); !s.ok()) {
    return s;
  }
  return reinterpret_cast<const float*>(HalfScores(window.half));
}

absl::Status CudaTapRing::Release() {
  if (base_ == nullptr && delivery_ == nullptr && host_ == nullptr) return absl::OkStatus();
  DeviceGuard guard(device_);
  absl::Status status;
  // The decode stream has waited for the last reader of each half (Tap::Close): after these,
  // nothing on the GPU reads or writes the ring.
  status.Update(Cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"));
  if (delivery_ != nullptr) {
    status.Update(Cuda(cudaStreamSynchronize(delivery_), "cudaStreamSynchronize"));
  }
  // The session's end releases what these fail to: their errors are not the caller's.
  for (IpcEvent* event : {&ready_[0], &ready_[1], &done_[0], &done_[1]}) {
    if (event->event_id != 0) client_.UnregisterEvent(event->event_id, session_id_).IgnoreError();
    if (event->event != nullptr) cudaEventDestroy(event->event);
    *event = IpcEvent{};
  }
  if (buffer_id_ != 0) client_.UnregisterBuffer(buffer_id_, session_id_).status().IgnoreError();
  buffer_id_ = 0;
  for (cudaEvent_t& event : copied_) {
    if (event != nullptr) cudaEventDestroy(event);
    event = nullptr;
  }
  for (auto& set : timing_) {
    for (cudaEvent_t& event : set) {
      if (event != nullptr) cudaEventDestroy(event);
      event = nullptr;
    }
  }
  for (cudaEvent_t& event : ready_host_) {
    if (event != nullptr) cudaEventDestroy(event);
    event = nullptr;
  }
  if (delivery_ != nullptr) cudaStreamDestroy(delivery_);
  delivery_ = nullptr;
  if (host_ != nullptr) status.Update(Cuda(cudaFreeHost(host_), "cudaFreeHost"));
  host_ = nullptr;
  if (base_ != nullptr) status.Update(Cuda(cudaFree(base_), "cudaFree"));
  base_ = nullptr;
  return status;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tap>> Tap::Create(Client& client, uint64_t session_id,
                                                 const std::string& probe_set,
                                                 const TapOptions& options) {
  if (session_id == 0) {
    return absl::InvalidArgumentError(
        "a tap needs a session (Session::Open): its ring and events are registered under it");
  }
  absl::StatusOr<v1::ServerInfoResponse> server = client.ServerInfo();
  if (!server.ok()) return server.status();
  const v1::ProbeSetInfo* info = nullptr;
  for (const v1::ProbeSetInfo& set : server->probe_sets()) {
    if (set.name() == probe_set) info = &set;
  }
  if (info == nullptr) {
    return absl::NotFoundError(absl::StrCat("probe set '", probe_set, "' is not loaded"));
  }
  const int32_t hidden = options.hidden_size == 0 ? info->hidden_size() : options.hidden_size;
  if (absl::Status s = CheckTapShape(*info, hidden, options.max_batch, options.window,
                                     server->limits().max_rows());
      !s.ok()) {
    return s;
  }
  if (absl::StatusOr<common::DType> dtype = RowType(options.dtype); !dtype.ok()) {
    return dtype.status();
  }
  TapOptions resolved = options;
  if (resolved.submit == TapSubmit::kAuto) {
    resolved.submit = server->mps() ? TapSubmit::kHost : TapSubmit::kGpu;
  }
  int device = options.device;
  if (device < 0) {
    if (absl::Status s = Cuda(cudaGetDevice(&device), "cudaGetDevice"); !s.ok()) return s;
  }
  absl::StatusOr<std::unique_ptr<CudaTapRing>> ring =
      CudaTapRing::Create(client, session_id, *info, resolved, device);
  if (!ring.ok()) return ring.status();
  auto pipeline = std::make_unique<ScorePipeline>(client);
  ScorePipeline* stream = pipeline.get();
  TapSubmitter submitter;
  submitter.submit = [stream](v1::ScoreRequest request,
                              std::function<void(const TapSubmitter::Answer&)> on_answer) {
    stream->Submit(std::move(request), std::move(on_answer));
  };
  submitter.cancel = [stream] { stream->Cancel(); };
  absl::StatusOr<std::unique_ptr<Tap>> tap =
      WithRing(*std::move(ring), std::move(submitter), *info, resolved);
  if (!tap.ok()) return tap.status();
  (*tap)->pipeline_ = std::move(pipeline);
  return tap;
}

}  // namespace probesidecar::client
