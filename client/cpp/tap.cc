// The tap's host side: windows, halves, delivery, results and misuse errors, over any TapRing
// (the CUDA ring is in cuda_tap_ring.cc).
#include "client/cpp/tap.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/cpp/score_pipeline.h"

namespace probesidecar::client {

using Clock = std::chrono::steady_clock;

struct Tap::Pending {
  TapRing::Window ring;
  int64_t first_step = 0;
  Clock::time_point closed_at;
  // Guarded by mu_: the answer is in and the ring's Answered has returned (the half may then be
  // reused after BeforeReuse); `error` is set before.
  bool settled = false;
  absl::Status error;
};

namespace {

Clock::time_point DeadlineAfter(double seconds) {
  if (!(seconds > 0)) return Clock::now();
  if (seconds > 1e7) return Clock::time_point::max();
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

std::vector<float> Thresholds(const v1::ProbeSetInfo& info) {
  std::vector<float> thresholds(info.num_probes(), std::numeric_limits<float>::infinity());
  for (int p = 0; p < info.probes_size() && p < info.num_probes(); ++p) {
    if (info.probes(p).has_threshold()) thresholds[p] = info.probes(p).threshold();
  }
  return thresholds;
}

}  // namespace

double TapWindow::latency_s() const {
  return std::chrono::duration<double>(delivered_at - closed_at).count();
}

const float* TapWindow::Scores(int32_t step, int32_t row) const {
  return scores.data() + (int64_t{step} * max_batch + row) * num_probes;
}

bool TapWindow::Fired(int32_t step, int32_t row, int32_t probe) const {
  return fired[(int64_t{step} * max_batch + row) * num_probes + probe] != 0;
}

absl::Status CheckTapShape(const v1::ProbeSetInfo& info, int32_t hidden_size, int32_t max_batch,
                           int32_t window, uint32_t max_rows) {
  if (hidden_size != info.hidden_size()) {
    return absl::InvalidArgumentError(absl::StrCat("hidden_size ", hidden_size,
                                                   " does not match probe set '", info.name(),
                                                   "' (H = ", info.hidden_size(), ")"));
  }
  if (max_batch < 1 || window < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_batch and window must be at least 1, got ", max_batch, " and ", window));
  }
  const int64_t rows = int64_t{window} * max_batch;
  if (max_rows != 0 && rows > max_rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("a window of ", window, " steps x ", max_batch, " rows is ", rows,
                     " rows, more than the server's --max-rows (", max_rows,
                     "): use a smaller window or max_batch"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Tap>> Tap::WithRing(std::unique_ptr<TapRing> ring,
                                                   TapSubmitter submitter,
                                                   const v1::ProbeSetInfo& info,
                                                   const TapOptions& options) {
  const int32_t hidden = options.hidden_size == 0 ? info.hidden_size() : options.hidden_size;
  if (absl::Status s = CheckTapShape(info, hidden, options.max_batch, options.window, 0); !s.ok()) {
    return s;
  }
  if (!(options.max_window_seconds >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_window_seconds must be 0 (none) or positive, got ", options.max_window_seconds));
  }
  if (options.max_queued_windows < 1) {
    return absl::InvalidArgumentError("max_queued_windows must be at least 1");
  }
  if (ring == nullptr || !submitter.submit) {
    return absl::InvalidArgumentError("a tap needs a ring and a way to submit its requests");
  }
  return std::unique_ptr<Tap>(new Tap(std::move(ring), std::move(submitter), info, options));
}

Tap::Tap(std::unique_ptr<TapRing> ring, TapSubmitter submitter, const v1::ProbeSetInfo& info,
         const TapOptions& options)
    : ring_(std::move(ring)),
      submitter_(std::move(submitter)),
      probe_set_(info.name()),
      window_(options.window),
      max_batch_(options.max_batch),
      num_probes_(info.num_probes()),
      hidden_size_(info.hidden_size()),
      thresholds_(Thresholds(info)),
      max_window_seconds_(options.max_window_seconds),
      on_window_(options.on_window),
      host_results_(options.host_results || options.on_window != nullptr),
      max_queued_windows_(options.max_queued_windows),
      submit_from_host_(options.submit == TapSubmit::kHost) {
  delivery_ = std::thread([this] { DeliverLoop(); });
  if (submit_from_host_) submit_thread_ = std::thread([this] { SubmitLoop(); });
}

Tap::~Tap() { Close().IgnoreError(); }

// --- the decode thread

absl::Status Tap::CheckOpen() const {
  if (closed_) {
    return absl::FailedPreconditionError(
        absl::StrCat("the tap on probe set '", probe_set_, "' is closed"));
  }
  return absl::OkStatus();
}

absl::Status Tap::Write(const TapRows& rows) {
  if (absl::Status s = CheckOpen(); !s.ok()) return s;
  if (rows.data == nullptr) return absl::InvalidArgumentError("Write() needs rows (data is null)");
  if (rows.n < 1 || rows.n > max_batch_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Write() of ", rows.n, " rows: the tap holds 1 to max_batch = ", max_batch_, " per step"));
  }
  TapRows checked = rows;
  if (checked.row_stride == 0) checked.row_stride = hidden_size_;
  if (checked.row_stride < hidden_size_) {
    return absl::InvalidArgumentError(absl::StrCat("Write(): row_stride ", checked.row_stride,
                                                   " is shorter than a row (H = ", hidden_size_,
                                                   ")"));
  }
  if (rows.device_num_rows32 != nullptr && rows.device_num_rows64 != nullptr) {
    return absl::InvalidArgumentError("Write(): name one device row count, not two");
  }
  return ring_->Write(checked);
}

absl::Status Tap::Step() {
  if (absl::Status s = CheckOpen(); !s.ok()) return s;
  if (in_window_ == 0 && max_window_seconds_ > 0) window_started_ = Clock::now();
  ++in_window_;
  ++step_;
  steps_counted_.fetch_add(1, std::memory_order_relaxed);
  bool close = in_window_ >= window_;
  if (!close && max_window_seconds_ > 0) {
    close = std::chrono::duration<double>(Clock::now() - window_started_).count() >=
            max_window_seconds_;
  }
  if (close) {
    if (absl::Status s = CloseWindow(); !s.ok()) return s;
  }
  return PopError();
}

absl::Status Tap::Flush() {
  if (absl::Status s = CheckOpen(); !s.ok()) return s;
  if (in_window_ > 0) {
    if (absl::Status s = CloseWindow(); !s.ok()) return s;
  }
  return PopError();
}

absl::Status Tap::CloseWindow(Clock::time_point deadline) {
  const int32_t half = half_;
  auto window = std::make_shared<Pending>();
  window->ring = TapRing::Window{windows_, half, in_window_};
  window->first_step = step_ - in_window_;
  window->closed_at = Clock::now();
  absl::StatusOr<v1::ScoreRequest> request = ring_->CloseWindow(window->ring);
  ++windows_;
  windows_closed_.fetch_add(1, std::memory_order_relaxed);
  last_[half] = window;
  half_ = 1 - half;
  in_window_ = 0;
  if (!request.ok()) {
    Answered(window, request.status());  // delivered as failed
  } else if (submit_from_host_) {
    std::lock_guard<std::mutex> lock(mu_);
    submissions_.emplace_back(window, *std::move(request));
    submit_cv_.notify_one();
  } else {
    Send(window, *std::move(request));
  }
  // The other half's previous window: its answer is normally in long ago (a whole window of
  // steps has passed); the ring's GPU-side wait then makes the next writes follow its reads.
  const std::shared_ptr<Pending> previous = last_[half_];
  absl::Status reuse;
  if (previous != nullptr) {
    if (!WaitSettled(*previous, deadline)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "window ", previous->ring.index, " not answered in time: its half is not reused"));
    }
    reuse = ring_->BeforeReuse(previous->ring);
  }
  return request.ok() ? reuse : request.status();
}

absl::StatusOr<const float*> Tap::DeviceScores(int64_t index, cudaStream_t stream) {
  if (absl::Status s = CheckOpen(); !s.ok()) return s;
  std::shared_ptr<Pending> window;
  for (const std::shared_ptr<Pending>& w : last_) {
    if (w != nullptr && w->ring.index == index) window = w;
  }
  if (window == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "window ", index, " is not in the ring (the last closed window of each half is)"));
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    settled_cv_.wait(lock, [&] { return window->settled; });
    if (!window->error.ok()) return window->error;
  }
  return ring_->DeviceScores(window->ring, stream);
}

absl::Status Tap::PopError() {
  if (!has_errors_.load(std::memory_order_acquire)) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  if (errors_.empty()) return absl::OkStatus();
  absl::Status error = std::move(errors_.front());
  errors_.pop_front();
  has_errors_.store(!errors_.empty(), std::memory_order_release);
  return error;
}

void Tap::PushError(absl::Status error) {
  std::lock_guard<std::mutex> lock(mu_);
  errors_.push_back(std::move(error));
  has_errors_.store(true, std::memory_order_release);
}

bool Tap::WaitSettled(Pending& window, Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  if (deadline == Clock::time_point::max()) {
    settled_cv_.wait(lock, [&] { return window.settled; });
    return true;
  }
  return settled_cv_.wait_until(lock, deadline, [&] { return window.settled; });
}

absl::Status Tap::Close(double timeout_s) {
  if (closed_) return absl::OkStatus();
  absl::Status status;
  const Clock::time_point deadline = DeadlineAfter(timeout_s);
  if (in_window_ > 0) status.Update(CloseWindow(deadline));
  bool answered = true;
  for (const std::shared_ptr<Pending>& w : last_) {
    if (w != nullptr && !WaitSettled(*w, deadline)) answered = false;
  }
  if (!answered) {
    status.Update(absl::DeadlineExceededError(absl::StrCat("the tap on probe set '", probe_set_,
                                                           "': windows not answered within ",
                                                           timeout_s, " s (cancelled)")));
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    if (submitter_.cancel) submitter_.cancel();
    const Clock::time_point again = DeadlineAfter(timeout_s);
    for (const std::shared_ptr<Pending>& w : last_) {
      if (w != nullptr) WaitSettled(*w, again);
    }
  }
  status.Update(WaitDelivered(timeout_s));
  closed_ = true;
  // The submit thread first (every window is sent or cancelled), then the transport (it waits
  // for any answer still on its way, while the delivery thread still frees what those answers
  // wait for), then the delivery thread (it drains what is queued), then the ring.
  if (submit_thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      submissions_.emplace_back(nullptr, v1::ScoreRequest());
      submit_cv_.notify_one();
    }
    submit_thread_.join();
  }
  pipeline_.reset();
  {
    std::lock_guard<std::mutex> lock(mu_);
    deliveries_.push_back(nullptr);
  }
  delivery_cv_.notify_one();
  if (delivery_.joinable()) delivery_.join();
  for (const std::shared_ptr<Pending>& w : last_) {
    bool settled = false;
    if (w != nullptr) {
      std::lock_guard<std::mutex> lock(mu_);
      settled = w->settled;
    }
    if (settled) status.Update(ring_->BeforeReuse(w->ring));  // the GPU is done with both halves
  }
  status.Update(ring_->Release());
  return status;
}

// --- the submit, answer and delivery threads

void Tap::Send(const std::shared_ptr<Pending>& window, v1::ScoreRequest request) {
  submitter_.submit(std::move(request), [this, window](const TapSubmitter::Answer& answer) {
    Answered(window, answer);
  });
}

void Tap::SubmitLoop() {
  for (;;) {
    std::pair<std::shared_ptr<Pending>, v1::ScoreRequest> next;
    {
      std::unique_lock<std::mutex> lock(mu_);
      submit_cv_.wait(lock, [this] { return !submissions_.empty(); });
      next = std::move(submissions_.front());
      submissions_.pop_front();
    }
    if (next.first == nullptr) return;
    const absl::Status ready = ring_->ReadyWait(next.first->ring);
    bool stopping = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping = stopping_;
    }
    if (stopping) {
      Answered(next.first, absl::CancelledError("the tap was closed before the window was sent"));
    } else if (!ready.ok()) {
      Answered(next.first, ready);
    } else {
      Send(next.first, std::move(next.second));
    }
  }
}

void Tap::Answered(const std::shared_ptr<Pending>& window, const TapSubmitter::Answer& answer) {
  absl::Status error = answer.ok() ? absl::OkStatus() : answer.status();
  if (error.ok()) error = ring_->Answered(window->ring, host_results_);
  // Notified under the lock: a waiter that sees the window settled may go on to destroy the tap
  // (Close), and must not do so while this thread still uses the condition variables.
  std::lock_guard<std::mutex> lock(mu_);
  window->error = std::move(error);
  window->settled = true;
  deliveries_.push_back(window);
  settled_cv_.notify_all();
  delivery_cv_.notify_one();
}

void Tap::DeliverLoop() {
  for (;;) {
    std::shared_ptr<Pending> window;
    {
      std::unique_lock<std::mutex> lock(mu_);
      delivery_cv_.wait(lock, [this] { return !deliveries_.empty(); });
      window = std::move(deliveries_.front());
      deliveries_.pop_front();
    }
    if (window == nullptr) return;
    std::optional<TapWindow> delivered = Finish(*window);
    if (!delivered.has_value()) {  // scores stay on the device: answered is all there is
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.windows_delivered;
      }
      results_cv_.notify_all();
      continue;
    }
    const bool failed = !delivered->error.ok();
    if (failed) PushError(delivered->error);
    if (on_window_) {
      try {
        on_window_(*delivered);
      } catch (const std::exception& e) {  // the callback's bug must not stop delivery
        PushError(absl::InternalError(absl::StrCat("on_window threw: ", e.what())));
      } catch (...) {
        PushError(absl::InternalError("on_window threw"));
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!on_window_) {
        if (results_.size() >= max_queued_windows_) {
          results_.pop_front();
          ++stats_.windows_dropped;
        }
        results_.push_back(std::move(*delivered));
      }
      ++(failed ? stats_.windows_failed : stats_.windows_delivered);
    }
    results_cv_.notify_all();
  }
}

std::optional<TapWindow> Tap::Finish(Pending& window) {
  absl::Status error;
  {
    std::lock_guard<std::mutex> lock(mu_);
    error = window.error;
  }
  if (error.ok() && !host_results_) return std::nullopt;
  const int32_t steps = window.ring.steps;
  TapWindow out;
  out.index = window.ring.index;
  out.first_step = window.first_step;
  out.max_batch = max_batch_;
  out.num_probes = num_probes_;
  out.closed_at = window.closed_at;
  if (error.ok()) {
    TapRing::Fetched fetched;
    error = ring_->Fetch(window.ring, &fetched);
    const size_t size = static_cast<size_t>(steps) * max_batch_ * num_probes_;
    if (error.ok() &&
        (fetched.scores.size() != size || fetched.num_rows.size() != static_cast<size_t>(steps))) {
      error = absl::InternalError(absl::StrCat("window ", out.index, ": the ring fetched ",
                                               fetched.scores.size(), " scores for ", size));
    }
    if (error.ok() && fetched.writes != steps) {
      error = absl::InvalidArgumentError(
          absl::StrCat("window ", out.index, ": Write() landed ", fetched.writes,
                       " times but Step() was called ", steps,
                       " times (one Write per Step, and at most ", window_, " writes per window)"));
    }
    if (error.ok()) {
      out.scores = std::move(fetched.scores);
      out.num_rows = std::move(fetched.num_rows);
      out.device_latency_s = fetched.device_latency_s;
      out.host_memory_latency_s = fetched.host_memory_latency_s;
    }
  }
  out.delivered_at = Clock::now();
  if (!error.ok()) {
    out.error = std::move(error);
    out.device_latency_s.reset();
    out.host_memory_latency_s.reset();
    return out;
  }
  out.fired.assign(out.scores.size(), 0);
  for (int32_t s = 0; s < steps; ++s) {
    const int32_t written = std::clamp(out.num_rows[s], 0, max_batch_);
    for (int32_t r = 0; r < max_batch_; ++r) {
      const int64_t at = (int64_t{s} * max_batch_ + r) * num_probes_;
      for (int32_t p = 0; p < num_probes_; ++p) {
        const float v = out.scores[at + p];
        const bool finite = std::isfinite(v);
        out.fired[at + p] = finite && v >= thresholds_[p] ? 1 : 0;
        if (!finite && r < written) ++out.non_finite;
      }
    }
  }
  return out;
}

// --- results

std::optional<TapWindow> Tap::Get(double timeout_s) {
  const Clock::time_point deadline = DeadlineAfter(timeout_s);
  std::unique_lock<std::mutex> lock(mu_);
  if (!results_cv_.wait_until(lock, deadline, [this] { return !results_.empty(); })) {
    return std::nullopt;
  }
  TapWindow window = std::move(results_.front());
  results_.pop_front();
  return window;
}

absl::Status Tap::WaitDelivered(double timeout_s) {
  const Clock::time_point deadline = DeadlineAfter(timeout_s);
  std::unique_lock<std::mutex> lock(mu_);
  const auto done = [this] {
    return stats_.windows_delivered + stats_.windows_failed >=
           windows_closed_.load(std::memory_order_relaxed);
  };
  if (!results_cv_.wait_until(lock, deadline, done)) {
    return absl::DeadlineExceededError(absl::StrCat(
        windows_closed_.load(), " windows closed, ",
        stats_.windows_delivered + stats_.windows_failed, " delivered after ", timeout_s, " s"));
  }
  return absl::OkStatus();
}

TapStats Tap::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  TapStats stats = stats_;
  stats.steps = steps_counted_.load(std::memory_order_relaxed);
  stats.windows_closed = windows_closed_.load(std::memory_order_relaxed);
  return stats;
}

}  // namespace probesidecar::client
