// A tap: the way a C++ decode loop scores its hidden states — one Score per window of K steps.
//
// Each decode step writes its rows (the hidden state of every sequence) into the next slot of a
// ring the tap owns; every K steps one Score covers the window. Between the inference server and
// the sidecar the GPU then switches contexts once per window instead of once per step, which is
// what makes scoring cheap without MPS.
//
//   std::unique_ptr<Session> session = *Session::Open(client);
//   TapOptions options;
//   options.max_batch = 64;
//   options.window = 16;
//   options.stream = decode_stream;                     // writes and per-window event operations
//   std::unique_ptr<Tap> tap = *Tap::Create(client, session->id(), "demo", options);
//   for (int step = 0; step < steps; ++step) {
//     DecodeStep(decode_stream);                        // e.g. a CUDA graph replay
//     tap->Write(hidden, batch);                        // one kernel on the stream (capturable)
//     if (absl::Status s = tap->Step(); !s.ok()) ...    // host-side count: closes every K steps
//   }
//   tap->Close();                                       // scores the partial window, waits
//   while (std::optional<TapWindow> w = tap->Get(0)) ...  // or options.on_window
//
// The ring has 2K slots in two halves: while the sidecar scores one half, the loop writes the
// other, and a half is rewritten only once the host has seen the call that read it finish (never
// a wait on the GPU, which a dead or stuck sidecar could hold forever: reuse_timeout_seconds).
// The decode thread only counts steps and, once per window, closes it and queues the request;
// answers, copies of the scores to the host and the callback run on other threads.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/cpp/client.h"

namespace probesidecar::client {

class ScorePipeline;

// One window's scores, as delivered to TapOptions::on_window or Tap::Get.
struct TapWindow {
  int64_t index = 0;       // windows are numbered from 0, in the order they closed
  int64_t first_step = 0;  // the step number of the window's first slot (0 = the first Step())
  int32_t max_batch = 0;
  int32_t num_probes = 0;         // P
  std::vector<int32_t> num_rows;  // [steps]: rows written at each step of the window
  std::vector<float> scores;      // [steps, max_batch, P]; rows past num_rows[i] mean nothing
  std::vector<uint8_t> fired;     // [steps, max_batch, P]: 1 = a finite score >= its threshold
  int64_t non_finite = 0;         // scores of written rows that are NaN or infinite
  std::chrono::steady_clock::time_point closed_at;     // when Step() closed the window
  std::chrono::steady_clock::time_point delivered_at;  // when the scores were ready on the host
  // GPU time (seconds) from the window's close (after its last write) to its scores in device
  // memory, and to their copy in host memory; absent where not measured.
  std::optional<double> device_latency_s;
  std::optional<double> host_memory_latency_s;
  // Not OK when the window could not be scored (the server refused it, or its writes did not
  // match its steps): then it has no scores.
  absl::Status error;

  int32_t steps() const { return static_cast<int32_t>(num_rows.size()); }
  // Host time from the window's close to its delivery.
  double latency_s() const;
  // The P scores of row `row` at step `step` of the window (0 <= step < steps()).
  const float* Scores(int32_t step, int32_t row) const;
  bool Fired(int32_t step, int32_t row, int32_t probe) const;
};

struct TapStats {
  int64_t steps = 0;  // Step() calls
  int64_t windows_closed = 0;
  int64_t windows_delivered = 0;  // delivered with scores (device-only results: answered)
  int64_t windows_failed = 0;     // delivered with an error
  int64_t windows_dropped = 0;    // the oldest delivered window, dropped from a full Get() queue
};

// When a closed window's request is sent.
enum class TapSubmit {
  // kHost when the sidecar is an MPS client (ServerInfo.mps: a stream of one MPS client waiting on
  // another's event slows the decode loop), else kGpu.
  kAuto,
  // When the window closes; the sidecar waits (on its host) for the window's ready event before
  // it queues the scoring (the lowest latency).
  kGpu,
  // From the tap's submit thread once the window's writes have landed (the host waits on an
  // event): the sidecar's stream never waits.
  kHost,
};

struct TapOptions {
  int32_t max_batch = 0;                 // rows per step, at most
  int32_t window = 16;                   // K: steps per Score
  v1::DType dtype = v1::DTYPE_BFLOAT16;  // of the rows: bf16, fp16 or fp32
  int32_t hidden_size = 0;               // H; 0: the probe set's (else it must match)
  int device = -1;                       // the CUDA device; -1: the current one
  // The decode stream: Write() launches on it, and each window's close and its ready event go on
  // it. Capture the writes on this stream, or replay them on it; it must outlive the tap.
  // nullptr: the legacy default stream.
  cudaStream_t stream = nullptr;
  // Before a half of the ring is written again, the host checks that the call that read it has
  // finished (never a GPU-side wait on the decode stream, which a dead or stuck sidecar could
  // hold forever); past this many seconds Step() returns DEADLINE_EXCEEDED and the half is
  // reused all the same.
  double reuse_timeout_seconds = 10;
  // > 0: a Step() at least this long after its window's first step closes the window early.
  double max_window_seconds = 0;
  // Called with each window on the tap's delivery thread (never the decode thread); empty: the
  // windows queue for Get(), at most max_queued_windows (the oldest goes).
  std::function<void(const TapWindow&)> on_window;
  // False: the scores stay in the device ring (DeviceScores) and nothing is copied to the host.
  bool host_results = true;
  size_t max_queued_windows = 1024;
  TapSubmit submit = TapSubmit::kAuto;  // WithRing takes kAuto as kGpu
};

// The misuses a tap refuses when it is made (INVALID_ARGUMENT): H that does not match the probe
// set, max_batch or window below 1, a window of more rows than the server's max_rows (0: none).
absl::Status CheckTapShape(const v1::ProbeSetInfo& info, int32_t hidden_size, int32_t max_batch,
                           int32_t window, uint32_t max_rows);

// One step's rows for Tap::Write.
struct TapRows {
  const void* data = nullptr;  // [n, row_stride] of the tap's dtype on its device, columns
                               // contiguous, aligned to the element size
  int32_t n = 0;               // 1..max_batch
  int64_t row_stride = 0;      // elements between rows; 0: H
  // For a batch padded to a graph's size: how many of the n rows are real, read on the GPU when
  // the write runs (the loop writes it on its stream). At most one; neither: n. Clamped to [0, n].
  const int32_t* device_num_rows32 = nullptr;
  const int64_t* device_num_rows64 = nullptr;
};

// Where a tap's rows and scores live, and the GPU-side ordering around them. Tap::Create makes
// the CUDA ring; tests give their own. Methods marked (decode thread) are called from Write(),
// Step(), Flush() and Close(); the others from the tap's other threads, as noted.
class TapRing {
 public:
  // A closed window as the ring sees it. A half holds one window at a time: the next window of a
  // half is made only after BeforeReuse of the previous one.
  struct Window {
    int64_t index = 0;
    int32_t half = 0;
    int32_t steps = 0;  // 1..K
  };
  struct Fetched {
    std::vector<float> scores;      // [steps, max_batch, P]
    std::vector<int32_t> num_rows;  // [steps]
    int64_t writes = 0;             // how many writes landed in the window
    std::optional<double> device_latency_s, host_memory_latency_s;
  };
  virtual ~TapRing() = default;

  // (decode thread) Queues the copy of `rows` (already checked against max_batch and H).
  virtual absl::Status Write(const TapRows& rows) = 0;
  // (decode thread) Marks the end of `window` in its half, after its writes; sends the next
  // writes to the start of the other half; returns the Score request that reads the window.
  virtual absl::StatusOr<v1::ScoreRequest> CloseWindow(const Window& window) = 0;
  // (the submit thread, TapSubmit::kHost) Waits on the host until the window's writes have
  // landed.
  virtual absl::Status ReadyWait(const Window& window) = 0;
  // (decode thread) Orders the next writes into window.half after everything that reads it;
  // called once the window's answer is in and Answered has returned.
  virtual absl::Status BeforeReuse(const Window& window) = 0;
  // (the answer's thread) The server has answered `window` successfully: queue what Fetch needs
  // when `copy_scores` (host results), else nothing.
  virtual absl::Status Answered(const Window& window, bool copy_scores) = 0;
  // (the delivery thread) The scores of an answered window whose Answered copied them.
  virtual absl::Status Fetch(const Window& window, Fetched* out) = 0;
  // The window's scores in device memory, float32 [steps, max_batch, P], with `stream` ordered
  // after the sidecar's writes of them.
  // The window's scores in device memory once they are written (waited for on the host).
  virtual absl::StatusOr<const float*> DeviceScores(const Window& window, cudaStream_t stream) = 0;
  // (decode thread, last) Gives back what the ring holds; every window is done with it.
  virtual absl::Status Release() = 0;
};

// How a tap's requests reach the server: Tap::Create sends them on a ScorePipeline.
struct TapSubmitter {
  using Answer = absl::StatusOr<v1::ScoreResponse>;
  // Sends `request`; `on_answer` runs once with its answer or failure, on any thread (possibly
  // inside this call).
  std::function<void(v1::ScoreRequest request, std::function<void(const Answer&)> on_answer)>
      submit;
  // Fails every request not answered yet (Close past its timeout); may be empty.
  std::function<void()> cancel;
};

class Tap {
 public:
  // A CUDA tap on `probe_set`, its ring and IPC events registered under `session_id` (required:
  // keep the session open until the tap is closed). The ring is one cudaMalloc allocation (so
  // the caller's allocator settings do not matter), registered once; the requests go on a
  // ScorePipeline of the tap's own. NOT_FOUND for an unknown probe set; INVALID_ARGUMENT for the
  // misuses CheckTapShape names and for a dtype other than bf16, fp16 or fp32.
  static absl::StatusOr<std::unique_ptr<Tap>> Create(Client& client, uint64_t session_id,
                                                     const std::string& probe_set,
                                                     const TapOptions& options);
  // A tap over any ring and transport (tests; Create uses it). `info` names the probe set: its
  // H, P and thresholds.
  static absl::StatusOr<std::unique_ptr<Tap>> WithRing(std::unique_ptr<TapRing> ring,
                                                       TapSubmitter submitter,
                                                       const v1::ProbeSetInfo& info,
                                                       const TapOptions& options);
  ~Tap();  // Close(), if not closed yet
  Tap(const Tap&) = delete;
  Tap& operator=(const Tap&) = delete;

  // --- the decode thread

  // Copies `rows` into the current slot: one kernel on the tap's stream, capturable in the
  // caller's CUDA graph (a device-resident counter picks the slot, so every replay writes the
  // next one). Call Step() once per write, replayed or not. Capture with
  // cudaStreamCaptureModeThreadLocal: the tap's other threads call CUDA meanwhile.
  // INVALID_ARGUMENT for rows beyond max_batch, n < 1, a row stride below H or misaligned rows;
  // FAILED_PRECONDITION once closed.
  absl::Status Write(const TapRows& rows);
  absl::Status Write(const void* rows, int32_t n) { return Write(TapRows{rows, n}); }
  // Counts one decode step. Every `window` steps (or once max_window_seconds have passed since
  // the window's first step) the window closes and one Score is queued for it. Returns the error
  // of a window that failed since the last call (one per call, oldest first), or a failure to
  // close this one.
  absl::Status Step();
  // Closes the current window now, if it has a step (e.g. when the loop goes idle).
  absl::Status Flush();
  // Scores the partial window, waits (up to timeout_s for the answers, then as long again for
  // delivery) for every window, then releases the ring. DEADLINE_EXCEEDED when the answers did
  // not come in time (they are cancelled). Later calls do nothing and return OK.
  absl::Status Close(double timeout_s = 30.0);

  // Window `index`'s scores where the sidecar wrote them, float32 [steps, max_batch, P], for
  // readers on the GPU, once the sidecar has written them (waited for on the host, up to the
  // reuse timeout; `stream` is not made to wait). Only the last
  // window of each half is there, valid until the window two after it starts writing its half.
  // Call from the decode thread.
  absl::StatusOr<const float*> DeviceScores(int64_t index, cudaStream_t stream);

  // --- results (any thread)

  // The oldest delivered window not taken yet; nullopt if none comes within `timeout_s`.
  std::optional<TapWindow> Get(double timeout_s = 0.0);
  // Waits until every closed window has been delivered (or failed).
  absl::Status WaitDelivered(double timeout_s = 30.0);
  TapStats stats() const;

  const std::string& probe_set() const { return probe_set_; }
  int32_t window() const { return window_; }
  int32_t max_batch() const { return max_batch_; }
  int32_t num_probes() const { return num_probes_; }

 private:
  struct Pending;  // a closed window on its way

  Tap(std::unique_ptr<TapRing> ring, TapSubmitter submitter, const v1::ProbeSetInfo& info,
      const TapOptions& options);
  absl::Status CheckOpen() const;
  // Closes the current window and waits (until `deadline`) for the answer to the other half's
  // previous window before ordering the next writes after its reads.
  absl::Status CloseWindow(std::chrono::steady_clock::time_point deadline =
                               std::chrono::steady_clock::time_point::max());
  absl::Status PopError();
  void PushError(absl::Status error);
  void Send(const std::shared_ptr<Pending>& window, v1::ScoreRequest request);
  void Answered(const std::shared_ptr<Pending>& window, const TapSubmitter::Answer& answer);
  void SubmitLoop();
  void DeliverLoop();
  std::optional<TapWindow> Finish(Pending& window);
  bool WaitSettled(Pending& window, std::chrono::steady_clock::time_point deadline);

  std::unique_ptr<TapRing> ring_;
  TapSubmitter submitter_;
  std::unique_ptr<ScorePipeline> pipeline_;  // Create's transport; destroyed after the ring
  const std::string probe_set_;
  const int32_t window_, max_batch_, num_probes_, hidden_size_;
  const std::vector<float> thresholds_;  // [P]; +inf for a probe without one
  const double max_window_seconds_;
  const std::function<void(const TapWindow&)> on_window_;
  const bool host_results_;
  const size_t max_queued_windows_;
  const bool submit_from_host_;

  // The decode thread's.
  bool closed_ = false;
  int64_t step_ = 0;
  int32_t half_ = 0;
  int32_t in_window_ = 0;
  int64_t windows_ = 0;
  std::chrono::steady_clock::time_point window_started_;
  std::shared_ptr<Pending> last_[2];  // the last window of each half

  // Shared with the answer and delivery threads.
  mutable std::mutex mu_;
  std::condition_variable settled_cv_;   // a window settled
  std::condition_variable delivery_cv_;  // deliveries_ grew
  std::condition_variable results_cv_;   // a window was delivered
  std::condition_variable submit_cv_;    // submissions_ grew
  // Closed windows for the submit thread (kHost), with their requests (a null window: stop).
  std::deque<std::pair<std::shared_ptr<Pending>, v1::ScoreRequest>> submissions_;
  bool stopping_ = false;  // Close gave up on the answers: the submit thread sends nothing more
  std::deque<std::shared_ptr<Pending>> deliveries_;  // settled, not delivered yet (null: stop)
  std::deque<TapWindow> results_;
  std::deque<absl::Status> errors_;
  std::atomic<bool> has_errors_{false};
  std::atomic<int64_t> steps_counted_{0}, windows_closed_{0};  // written by the decode thread
  TapStats stats_;                                             // the delivery counts
  std::thread delivery_;
  std::thread submit_thread_;  // kHost only
};

}  // namespace probesidecar::client
