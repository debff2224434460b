// The C++ tap's host side (client/cpp/tap.h) without a GPU or a server: a ring in host memory
// written by the tap kernels' CPU reference, and a fake sidecar on its own thread that scores a
// window's slots when it answers. Windows, halves, the order of answers and reuse, delivery,
// results, errors and misuse, as the CUDA tap has them.
#include "client/cpp/tap.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/tap_write/tap_write.h"
#include "kernels/tap_write/tap_write_ref.h"

namespace probesidecar {
namespace {

using client::Tap;
using client::TapOptions;
using client::TapRing;
using client::TapRows;
using client::TapSubmitter;
using client::TapWindow;

constexpr int32_t kHidden = 16, kProbes = 3;
const float kThresholds[kProbes] = {0.0f, 1.0f, std::numeric_limits<float>::infinity()};

double Weight(int p, int h) { return (p + 1) * 0.25 * ((h % 5) - 2) + 0.01 * h; }
double Bias(int p) { return 0.5 * p - 0.25; }

std::vector<double> Reference(const float* row) {
  std::vector<double> out(kProbes);
  for (int p = 0; p < kProbes; ++p) {
    double sum = Bias(p);
    for (int h = 0; h < kHidden; ++h) sum += double{row[h]} * Weight(p, h);
    out[p] = sum;
  }
  return out;
}

v1::ProbeSetInfo Info() {
  v1::ProbeSetInfo info;
  info.set_name("fake");
  info.set_hidden_size(kHidden);
  info.set_num_probes(kProbes);
  for (int p = 0; p < kProbes; ++p) {
    v1::Probe* probe = info.add_probes();
    probe->set_name(absl::StrCat("p", p));
    if (!std::isinf(kThresholds[p])) probe->set_threshold(kThresholds[p]);
  }
  return info;
}

// What the tap asked of the ring and the sidecar, in order.
class Log {
 public:
  void Add(std::string event) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(event));
    cv_.notify_all();
  }
  std::vector<std::string> events() const {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }
  // Position of `event`, or -1.
  int Find(const std::string& event) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find(events_.begin(), events_.end(), event);
    return it == events_.end() ? -1 : static_cast<int>(it - events_.begin());
  }
  bool WaitFor(const std::string& event, double seconds) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::duration<double>(seconds), [&] {
      return std::find(events_.begin(), events_.end(), event) != events_.end();
    });
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> events_;
};

// A float32 ring in host memory laid out like the CUDA ring's slots (2K + 1 of [max_batch, H],
// NaN before the first write), its writes and closes made by the kernels' CPU reference, so the
// write counts, row counts and spare slot behave as on the GPU. rows.data is a host pointer here,
// and so are the device row counts.
class FakeRing final : public TapRing {
 public:
  FakeRing(int32_t window, int32_t max_batch, Log* log)
      : window_(window),
        max_batch_(max_batch),
        log_(log),
        slots_((2 * window + 1) * int64_t{max_batch} * kHidden,
               std::numeric_limits<float>::quiet_NaN()),
        scores_(2 * window * int64_t{max_batch} * kProbes, std::numeric_limits<float>::quiet_NaN()),
        counts_(2 * window + 1, 0) {
    meta_[kernels::kTapMetaLimit] = window;
  }

  absl::Status Write(const TapRows& rows) override {
    kernels::TapWriteParams p;
    p.src = rows.data;
    p.slots = slots_.data();
    p.meta = meta_;
    p.counts = counts_.data();
    p.num_rows32 = rows.device_num_rows32;
    p.num_rows64 = rows.device_num_rows64;
    p.src_row_stride = rows.row_stride;
    p.n = rows.n;
    p.max_batch = max_batch_;
    p.hidden = kHidden;
    p.overflow_slot = 2 * window_;
    p.dtype = common::DType::kFloat32;
    if (!kernels::TapWriteRef(p)) return absl::InvalidArgumentError("refused by the reference");
    return absl::OkStatus();
  }

  absl::StatusOr<v1::ScoreRequest> CloseWindow(const Window& window) override {
    const int64_t next = int64_t{1 - window.half} * window_;
    if (!kernels::TapCloseRef({meta_, window.half, next, next + window_})) {
      return absl::InternalError("close refused");
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      windows_[window.index] = window;
    }
    log_->Add(absl::StrCat("close ", window.index));
    v1::ScoreRequest request;
    request.set_probe_set("fake");
    request.set_request_id(window.index);
    return request;
  }

  absl::Status ReadyWait(const Window& window) override {
    log_->Add(absl::StrCat("ready wait ", window.index));
    return absl::OkStatus();
  }

  absl::Status BeforeReuse(const Window& window) override {
    log_->Add(absl::StrCat("reuse ", window.index));
    return absl::OkStatus();
  }

  // The fake sidecar's work (its thread): scores of every slot of the window's half, float64
  // math rounded once to float32.
  void Score(int64_t index) {
    Window window;
    {
      std::lock_guard<std::mutex> lock(mu_);
      window = windows_.at(index);
    }
    const int64_t first_slot = int64_t{window.half} * window_;
    for (int64_t slot = first_slot; slot < first_slot + window.steps; ++slot) {
      for (int32_t r = 0; r < max_batch_; ++r) {
        const std::vector<double> want =
            Reference(slots_.data() + (slot * max_batch_ + r) * kHidden);
        for (int p = 0; p < kProbes; ++p) {
          scores_[(slot * max_batch_ + r) * kProbes + p] = static_cast<float>(want[p]);
        }
      }
    }
  }

  absl::Status Answered(const Window& window, bool copy_scores) override {
    log_->Add(absl::StrCat("answered ", window.index, copy_scores ? " copy" : ""));
    if (!copy_scores) return absl::OkStatus();
    // What the CUDA ring's delivery copy takes: the window's scores, counts and write count.
    Fetched copy;
    const int64_t first_slot = int64_t{window.half} * window_;
    copy.scores.assign(scores_.begin() + first_slot * max_batch_ * kProbes,
                       scores_.begin() + (first_slot + window.steps) * max_batch_ * kProbes);
    copy.num_rows.assign(counts_.begin() + first_slot, counts_.begin() + first_slot + window.steps);
    copy.writes = meta_[kernels::kTapMetaHalfWrites + window.half];
    copy.device_latency_s = 0.0;
    std::lock_guard<std::mutex> lock(mu_);
    copies_[window.index] = std::move(copy);
    return absl::OkStatus();
  }

  absl::Status Fetch(const Window& window, Fetched* out) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = copies_.find(window.index);
    if (it == copies_.end()) return absl::InternalError("fetched before answered");
    *out = std::move(it->second);
    copies_.erase(it);
    return absl::OkStatus();
  }

  absl::StatusOr<const float*> DeviceScores(const Window& window, cudaStream_t) override {
    log_->Add(absl::StrCat("device scores ", window.index));
    return scores_.data() + int64_t{window.half} * window_ * max_batch_ * kProbes;
  }

  absl::Status Release() override {
    log_->Add("release");
    return absl::OkStatus();
  }

 private:
  const int32_t window_, max_batch_;
  Log* log_;
  std::vector<float> slots_, scores_;
  std::vector<int32_t> counts_;
  int64_t meta_[kernels::kTapMetaSize] = {};
  std::mutex mu_;
  std::map<int64_t, Window> windows_;
  std::map<int64_t, Fetched> copies_;
};

// The fake sidecar: answers requests in order on its own thread, after scoring the window; can
// hold its answers, refuse a window, and be cancelled.
class FakeSidecar {
 public:
  ~FakeSidecar() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  void Attach(FakeRing* ring) {
    ring_ = ring;
    thread_ = std::thread([this] { Loop(); });
  }
  TapSubmitter Submitter() {
    TapSubmitter s;
    s.submit = [this](v1::ScoreRequest request,
                      std::function<void(const TapSubmitter::Answer&)> on_answer) {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back({std::move(request), std::move(on_answer)});
      ++submitted_;
      submitting_threads_.insert(std::this_thread::get_id());
      cv_.notify_all();
    };
    s.cancel = [this] {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled_ = true;
      cv_.notify_all();
    };
    return s;
  }
  void Hold(bool hold) {
    std::lock_guard<std::mutex> lock(mu_);
    hold_ = hold;
    cv_.notify_all();
  }
  void Refuse(int64_t index, absl::Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    refuse_[index] = std::move(status);
  }
  int submitted() {
    std::lock_guard<std::mutex> lock(mu_);
    return submitted_;
  }
  std::set<std::thread::id> submitting_threads() {
    std::lock_guard<std::mutex> lock(mu_);
    return submitting_threads_;
  }

 private:
  struct Request {
    v1::ScoreRequest request;
    std::function<void(const TapSubmitter::Answer&)> on_answer;
  };
  void Loop() {
    for (;;) {
      Request next;
      absl::Status refusal;
      bool cancelled = false;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || (!queue_.empty() && (!hold_ || cancelled_)); });
        if (queue_.empty()) return;
        next = std::move(queue_.front());
        queue_.pop_front();
        cancelled = cancelled_;
        if (auto it = refuse_.find(static_cast<int64_t>(next.request.request_id()));
            it != refuse_.end()) {
          refusal = it->second;
        }
      }
      if (cancelled) {
        next.on_answer(absl::CancelledError("cancelled"));
      } else if (!refusal.ok()) {
        next.on_answer(refusal);
      } else {
        ring_->Score(static_cast<int64_t>(next.request.request_id()));
        v1::ScoreResponse response;
        response.set_request_id(next.request.request_id());
        response.set_enqueued(true);
        next.on_answer(response);
      }
    }
  }

  FakeRing* ring_ = nullptr;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Request> queue_;
  std::map<int64_t, absl::Status> refuse_;
  bool hold_ = false, cancelled_ = false, stop_ = false;
  int submitted_ = 0;
  std::set<std::thread::id> submitting_threads_;
  std::thread thread_;
};

// A tap over a FakeRing and a FakeSidecar. The sidecar is declared first: it outlives the tap.
struct Fixture {
  explicit Fixture(TapOptions options) {
    if (options.max_batch == 0) options.max_batch = 5;
    auto ring = std::make_unique<FakeRing>(options.window, options.max_batch, &log);
    FakeRing* raw = ring.get();
    sidecar.Attach(raw);
    absl::StatusOr<std::unique_ptr<Tap>> made =
        Tap::WithRing(std::move(ring), sidecar.Submitter(), Info(), options);
    EXPECT_TRUE(made.ok()) << made.status();
    if (made.ok()) tap = *std::move(made);
  }
  Log log;
  FakeSidecar sidecar;
  std::unique_ptr<Tap> tap;
};

// Random rows, step by step: [n, kHidden] float32 each, kept for the reference.
struct Rows {
  explicit Rows(uint32_t seed) : rng(seed) {}
  const std::vector<float>& Next(int32_t n) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> rows(n * kHidden);
    for (float& v : rows) v = normal(rng);
    written.push_back(std::move(rows));
    return written.back();
  }
  std::mt19937 rng;
  std::vector<std::vector<float>> written;
};

TapOptions Options(int32_t window, int32_t max_batch) {
  TapOptions options;
  options.window = window;
  options.max_batch = max_batch;
  return options;
}

std::vector<TapWindow> Drain(Tap& tap) {
  std::vector<TapWindow> windows;
  while (std::optional<TapWindow> w = tap.Get(0)) windows.push_back(std::move(*w));
  return windows;
}

void ExpectScores(const TapWindow& window, const Rows& rows) {
  ASSERT_TRUE(window.error.ok()) << window.error;
  for (int32_t i = 0; i < window.steps(); ++i) {
    const std::vector<float>& step = rows.written[window.first_step + i];
    const int32_t n = static_cast<int32_t>(step.size() / kHidden);
    ASSERT_EQ(window.num_rows[i], n) << "step " << window.first_step + i;
    for (int32_t r = 0; r < n; ++r) {
      const std::vector<double> want = Reference(step.data() + r * kHidden);
      for (int p = 0; p < kProbes; ++p) {
        const float got = window.Scores(i, r)[p];
        EXPECT_NEAR(got, want[p], 1e-6 * (1 + std::abs(want[p])))
            << "step " << window.first_step + i << " row " << r << " probe " << p;
        EXPECT_EQ(window.Fired(i, r, p), got >= kThresholds[p]) << p;
      }
    }
  }
}

TEST(Tap, WindowsCoverEveryStepAndRowAgainstFloat64) {
  Fixture f(Options(4, 5));
  ASSERT_NE(f.tap, nullptr);
  Rows rows(1);
  const int32_t batches[] = {5, 3, 1, 4};
  for (int t = 0; t < 10; ++t) {  // two full windows, then two steps
    const int32_t n = batches[t % 4];
    ASSERT_TRUE(f.tap->Write(rows.Next(n).data(), n).ok());
    ASSERT_TRUE(f.tap->Step().ok());
  }
  ASSERT_TRUE(f.tap->Close().ok());  // scores the partial window
  const std::vector<TapWindow> windows = Drain(*f.tap);
  ASSERT_EQ(windows.size(), 3u);
  const int32_t steps[] = {4, 4, 2};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(windows[i].index, i);
    EXPECT_EQ(windows[i].steps(), steps[i]);
    EXPECT_EQ(windows[i].first_step, 4 * i);
    EXPECT_EQ(windows[i].non_finite, 0);
    EXPECT_GE(windows[i].latency_s(), 0.0);
    ExpectScores(windows[i], rows);
  }
  const client::TapStats stats = f.tap->stats();
  EXPECT_EQ(stats.steps, 10);
  EXPECT_EQ(stats.windows_closed, 3);
  EXPECT_EQ(stats.windows_delivered, 3);
  EXPECT_EQ(stats.windows_failed, 0);
  EXPECT_EQ(f.sidecar.submitted(), 3);  // one request per window, not per step
  EXPECT_EQ(f.log.events().back(), "release");
}

TEST(Tap, HostSubmissionSendsEachWindowFromItsOwnThreadAfterItsWrites) {
  TapOptions options = Options(3, 2);
  options.submit = client::TapSubmit::kHost;
  Fixture f(options);
  ASSERT_NE(f.tap, nullptr);
  Rows rows(13);
  for (int t = 0; t < 8; ++t) {  // two full windows and a partial one
    ASSERT_TRUE(f.tap->Write(rows.Next(2).data(), 2).ok());
    ASSERT_TRUE(f.tap->Step().ok());
  }
  ASSERT_TRUE(f.tap->Close().ok());
  const std::vector<TapWindow> windows = Drain(*f.tap);
  ASSERT_EQ(windows.size(), 3u);
  for (const TapWindow& window : windows) ExpectScores(window, rows);
  for (int w = 0; w < 3; ++w) {
    EXPECT_LT(f.log.Find(absl::StrCat("close ", w)), f.log.Find(absl::StrCat("ready wait ", w)));
    EXPECT_LT(f.log.Find(absl::StrCat("ready wait ", w)),
              f.log.Find(absl::StrCat("answered ", w, " copy")));
  }
  const std::set<std::thread::id> threads = f.sidecar.submitting_threads();
  EXPECT_EQ(threads.size(), 1u);
  EXPECT_EQ(threads.count(std::this_thread::get_id()), 0u);
}

TEST(Tap, AHalfIsRewrittenOnlyAfterTheAnswerToItsWindow) {
  Fixture f(Options(1, 2));
  ASSERT_NE(f.tap, nullptr);
  f.sidecar.Hold(true);
  Rows rows(2);
  absl::Status loop_status;
  std::thread loop([&] {
    for (int t = 0; t < 6 && loop_status.ok(); ++t) {
      loop_status = f.tap->Write(rows.Next(2).data(), 2);
      if (loop_status.ok()) loop_status = f.tap->Step();
    }
  });
  // Window 1 (half 1) has closed; the loop now waits for the answer to window 0 before it may
  // write half 0 again.
  ASSERT_TRUE(f.log.WaitFor("close 1", 30));
  EXPECT_EQ(f.log.Find("reuse 0"), -1);
  EXPECT_EQ(f.log.Find("close 2"), -1);
  f.sidecar.Hold(false);
  loop.join();
  ASSERT_TRUE(loop_status.ok()) << loop_status;
  ASSERT_TRUE(f.tap->Close().ok());
  for (int w = 0; w + 2 < 6; ++w) {
    const int answered = f.log.Find(absl::StrCat("answered ", w, " copy"));
    const int reuse = f.log.Find(absl::StrCat("reuse ", w));
    const int next = f.log.Find(absl::StrCat("close ", w + 2));
    ASSERT_GE(answered, 0) << w;
    EXPECT_LT(answered, reuse) << w;
    EXPECT_LT(reuse, next) << w;
  }
  for (const TapWindow& window : Drain(*f.tap)) ExpectScores(window, rows);
}

TEST(Tap, ACallbackGetsEachWindowOnTheDeliveryThread) {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int64_t> got;
  std::set<std::thread::id> threads;
  TapOptions options = Options(2, 1);
  options.on_window = [&](const TapWindow& window) {
    std::lock_guard<std::mutex> lock(mu);
    got.push_back(window.index);
    threads.insert(std::this_thread::get_id());
    cv.notify_all();
  };
  Fixture f(options);
  ASSERT_NE(f.tap, nullptr);
  Rows rows(3);
  for (int t = 0; t < 6; ++t) {
    ASSERT_TRUE(f.tap->Write(rows.Next(1).data(), 1).ok());
    ASSERT_TRUE(f.tap->Step().ok());
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return got.size() == 3; }));
  }
  ASSERT_TRUE(f.tap->Close().ok());
  EXPECT_EQ(got, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(threads.size(), 1u);
  EXPECT_EQ(threads.count(std::this_thread::get_id()), 0u);
  EXPECT_FALSE(f.tap->Get(0).has_value());  // a callback takes the windows instead of the queue
}

TEST(Tap, ATimeBoundClosesAPartialWindow) {
  TapOptions options = Options(1000, 1);
  options.max_window_seconds = 0.05;
  Fixture f(options);
  ASSERT_NE(f.tap, nullptr);
  Rows rows(4);
  ASSERT_TRUE(f.tap->Write(rows.Next(1).data(), 1).ok());
  ASSERT_TRUE(f.tap->Step().ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(60));  // the bound is what is tested
  ASSERT_TRUE(f.tap->Write(rows.Next(1).data(), 1).ok());
  ASSERT_TRUE(f.tap->Step().ok());
  std::optional<TapWindow> window = f.tap->Get(30);
  ASSERT_TRUE(window.has_value());
  EXPECT_EQ(window->steps(), 2);
  ExpectScores(*window, rows);
  ASSERT_TRUE(f.tap->Close().ok());
}

TEST(Tap, DeviceRowCountsMarkPaddedRowsAndPaddingIsNeverCounted) {
  Fixture f(Options(3, 4));
  ASSERT_NE(f.tap, nullptr);
  Rows rows(5);
  const int32_t counts[] = {2, 3, 9};  // 9: clamped to the 4 rows written
  for (int t = 0; t < 3; ++t) {
    TapRows step{rows.Next(4).data(), 4};
    step.device_num_rows32 = &counts[t];
    ASSERT_TRUE(f.tap->Write(step).ok());
    ASSERT_TRUE(f.tap->Step().ok());
  }
  std::optional<TapWindow> window = f.tap->Get(30);
  ASSERT_TRUE(window.has_value());
  ASSERT_TRUE(window->error.ok()) << window->error;
  EXPECT_EQ(window->num_rows, (std::vector<int32_t>{2, 3, 4}));
  ASSERT_TRUE(f.tap->Close().ok());
}

TEST(Tap, NonFiniteScoresOfWrittenRowsAreCountedAndNeverFire) {
  Fixture f(Options(1, 3));
  ASSERT_NE(f.tap, nullptr);
  std::vector<float> step(2 * kHidden, 1.0f);
  step[kHidden + 3] = std::numeric_limits<float>::quiet_NaN();  // row 1
  ASSERT_TRUE(f.tap->Write(step.data(), 2).ok());  // row 2 is never written: NaN in the ring
  ASSERT_TRUE(f.tap->Step().ok());
  std::optional<TapWindow> window = f.tap->Get(30);
  ASSERT_TRUE(window.has_value());
  ASSERT_TRUE(window->error.ok()) << window->error;
  EXPECT_EQ(window->non_finite, kProbes);  // row 1's, not row 2's
  for (int p = 0; p < kProbes; ++p) {
    EXPECT_TRUE(std::isnan(window->Scores(0, 1)[p]));
    EXPECT_FALSE(window->Fired(0, 1, p));
    EXPECT_TRUE(std::isnan(window->Scores(0, 2)[p]));
  }
  ASSERT_TRUE(f.tap->Close().ok());
}

TEST(Tap, StepsWithoutWritesFailTheWindowAndSayWhy) {
  Fixture f(Options(2, 1));
  ASSERT_NE(f.tap, nullptr);
  Rows rows(6);
  ASSERT_TRUE(f.tap->Write(rows.Next(1).data(), 1).ok());
  ASSERT_TRUE(f.tap->Step().ok());
  absl::Status second = f.tap->Step();  // no write for this step: the window closes
  std::optional<TapWindow> window = f.tap->Get(30);
  ASSERT_TRUE(window.has_value());
  EXPECT_EQ(window->error.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(window->error.message().find("Write() landed 1 times but Step() was called 2 times"),
            std::string::npos)
      << window->error;
  EXPECT_TRUE(window->scores.empty());
  // The decode thread hears of it at its next call (unless that was the closing Step itself).
  absl::Status next = second.ok() ? f.tap->Flush() : second;
  EXPECT_EQ(next.code(), absl::StatusCode::kInvalidArgument) << next;
  EXPECT_EQ(f.tap->stats().windows_failed, 1);
  ASSERT_TRUE(f.tap->Close().ok());
}

TEST(Tap, WritesPastTheWindowsEndFailItInsteadOfMixingSteps) {
  Fixture f(Options(2, 1));
  ASSERT_NE(f.tap, nullptr);
  Rows rows(7);
  ASSERT_TRUE(f.tap->Write(rows.Next(1).data(), 1).ok());
  ASSERT_TRUE(f.tap->Step().ok());
  ASSERT_TRUE(f.tap->Write(rows.Next(1).data(), 1).ok());
  ASSERT_TRUE(f.tap->Write(rows.Next(1).data(), 1).ok());  // two writes for one step
  f.tap->Step().IgnoreError();
  std::optional<TapWindow> window = f.tap->Get(30);
  ASSERT_TRUE(window.has_value());
  EXPECT_NE(window->error.message().find("landed 3 times but Step() was called 2 times"),
            std::string::npos)
      << window->error;
  ASSERT_TRUE(f.tap->Close().ok());
}

TEST(Tap, AWindowTheServerRefusesIsAnErrorNotStaleScores) {
  Fixture f(Options(1, 1));
  ASSERT_NE(f.tap, nullptr);
  f.sidecar.Refuse(1, absl::NotFoundError("probe set 'fake' is not loaded"));
  Rows rows(8);
  std::vector<absl::Status> statuses;
  for (int t = 0; t < 3; ++t) {
    ASSERT_TRUE(f.tap->Write(rows.Next(1).data(), 1).ok());
    statuses.push_back(f.tap->Step());
  }
  ASSERT_TRUE(f.tap->WaitDelivered(30).ok());
  absl::Status late = f.tap->Flush();  // nothing to close: reports what is left
  std::vector<TapWindow> windows = Drain(*f.tap);
  ASSERT_EQ(windows.size(), 3u);
  ExpectScores(windows[0], rows);
  EXPECT_EQ(windows[1].error.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(windows[1].scores.empty());
  EXPECT_TRUE(windows[1].num_rows.empty());
  ExpectScores(windows[2], rows);
  int not_found = late.code() == absl::StatusCode::kNotFound ? 1 : 0;
  for (const absl::Status& s : statuses) not_found += s.code() == absl::StatusCode::kNotFound;
  EXPECT_EQ(not_found, 1);  // reported once, by a later call
  EXPECT_EQ(f.tap->stats().windows_failed, 1);
  EXPECT_EQ(f.tap->stats().windows_delivered, 2);
  ASSERT_TRUE(f.tap->Close().ok());
}

TEST(Tap, MisuseIsRefusedClearly) {
  const v1::ProbeSetInfo info = Info();
  absl::Status s = client::CheckTapShape(info, kHidden + 1, 1, 1, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("does not match probe set 'fake' (H = 16)"), std::string::npos) << s;
  s = client::CheckTapShape(info, kHidden, 1 << 12, 1 << 12, 16384);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--max-rows (16384)"), std::string::npos) << s;
  EXPECT_TRUE(client::CheckTapShape(info, kHidden, 256, 64, 16384).ok());
  EXPECT_EQ(client::CheckTapShape(info, kHidden, 0, 4, 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client::CheckTapShape(info, kHidden, 4, 0, 0).code(),
            absl::StatusCode::kInvalidArgument);
  {
    Log log;
    TapOptions bad = Options(2, 2);
    bad.hidden_size = 8;
    EXPECT_EQ(Tap::WithRing(std::make_unique<FakeRing>(2, 2, &log), TapSubmitter{}, info, bad)
                  .status()
                  .code(),
              absl::StatusCode::kInvalidArgument);
  }

  Fixture f(Options(4, 2));
  ASSERT_NE(f.tap, nullptr);
  std::vector<float> rows(3 * (kHidden + 1), 0.0f);
  s = f.tap->Write(rows.data(), 3);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("max_batch = 2"), std::string::npos) << s;
  EXPECT_EQ(f.tap->Write(rows.data(), 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f.tap->Write(nullptr, 1).code(), absl::StatusCode::kInvalidArgument);
  TapRows short_rows{rows.data(), 1, kHidden - 1};
  s = f.tap->Write(short_rows);
  EXPECT_NE(s.message().find("shorter than a row"), std::string::npos) << s;
  const int32_t c32 = 1;
  const int64_t c64 = 1;
  TapRows two_counts{rows.data(), 1};
  two_counts.device_num_rows32 = &c32;
  two_counts.device_num_rows64 = &c64;
  EXPECT_EQ(f.tap->Write(two_counts).code(), absl::StatusCode::kInvalidArgument);
  TapRows strided{rows.data(), 2, kHidden + 1};  // a strided write is fine
  EXPECT_TRUE(f.tap->Write(strided).ok());
  EXPECT_TRUE(f.tap->Step().ok());
  ASSERT_TRUE(f.tap->Close().ok());
  EXPECT_TRUE(f.tap->Close().ok());  // again: nothing
  for (absl::Status after : {f.tap->Write(rows.data(), 1), f.tap->Step(), f.tap->Flush(),
                             f.tap->DeviceScores(0, nullptr).status()}) {
    EXPECT_EQ(after.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(after.message().find("the tap on probe set 'fake' is closed"), std::string::npos)
        << after;
  }
}

TEST(Tap, ADeviceOnlyTapCopiesNothingAndKeepsTheLastWindowOfEachHalf) {
  TapOptions options = Options(2, 2);
  options.host_results = false;
  Fixture f(options);
  ASSERT_NE(f.tap, nullptr);
  Rows rows(9);
  for (int t = 0; t < 8; ++t) {  // windows 0..3
    ASSERT_TRUE(f.tap->Write(rows.Next(2).data(), 2).ok());
    ASSERT_TRUE(f.tap->Step().ok());
  }
  ASSERT_TRUE(f.tap->WaitDelivered(30).ok());
  EXPECT_FALSE(f.tap->Get(0).has_value());
  EXPECT_EQ(f.tap->stats().windows_delivered, 4);
  EXPECT_EQ(f.log.Find("answered 0 copy"), -1);
  EXPECT_GE(f.log.Find("answered 0"), 0);
  // Window 3 (half 1): its scores where the sidecar wrote them.
  absl::StatusOr<const float*> scores = f.tap->DeviceScores(3, nullptr);
  ASSERT_TRUE(scores.ok()) << scores.status();
  for (int i = 0; i < 2; ++i) {
    for (int r = 0; r < 2; ++r) {
      const std::vector<double> want = Reference(rows.written[6 + i].data() + r * kHidden);
      for (int p = 0; p < kProbes; ++p) {
        EXPECT_NEAR((*scores)[(i * 2 + r) * kProbes + p], want[p], 1e-6 * (1 + std::abs(want[p])));
      }
    }
  }
  EXPECT_TRUE(f.tap->DeviceScores(2, nullptr).ok());
  EXPECT_EQ(f.tap->DeviceScores(1, nullptr).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(f.tap->DeviceScores(4, nullptr).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(f.tap->Close().ok());
}

TEST(Tap, AFullQueueDropsTheOldestWindow) {
  TapOptions options = Options(1, 1);
  options.max_queued_windows = 2;
  Fixture f(options);
  ASSERT_NE(f.tap, nullptr);
  Rows rows(10);
  for (int t = 0; t < 5; ++t) {
    ASSERT_TRUE(f.tap->Write(rows.Next(1).data(), 1).ok());
    ASSERT_TRUE(f.tap->Step().ok());
  }
  ASSERT_TRUE(f.tap->Close().ok());
  const std::vector<TapWindow> windows = Drain(*f.tap);
  ASSERT_EQ(windows.size(), 2u);
  EXPECT_EQ(windows[0].index, 3);
  EXPECT_EQ(windows[1].index, 4);
  EXPECT_EQ(f.tap->stats().windows_dropped, 3);
}

TEST(Tap, CloseCancelsWindowsNotAnsweredInTime) {
  Fixture f(Options(2, 1));
  ASSERT_NE(f.tap, nullptr);
  f.sidecar.Hold(true);
  Rows rows(11);
  for (int t = 0; t < 3; ++t) {  // window 0 closes (never answered), window 1 is partial
    ASSERT_TRUE(f.tap->Write(rows.Next(1).data(), 1).ok());
    ASSERT_TRUE(f.tap->Step().ok());
  }
  // Closing window 1 waits for window 0's answer (its half is next) only until the deadline.
  const absl::Status closed = f.tap->Close(0.05);
  EXPECT_EQ(closed.code(), absl::StatusCode::kDeadlineExceeded) << closed;
  for (int i = 0; i < 2; ++i) {
    std::optional<TapWindow> window = f.tap->Get(0);
    ASSERT_TRUE(window.has_value()) << i;
    EXPECT_EQ(window->index, i);
    EXPECT_EQ(window->error.code(), absl::StatusCode::kCancelled);
  }
  EXPECT_EQ(f.tap->stats().windows_failed, 2);
  EXPECT_EQ(f.log.events().back(), "release");
}

TEST(Tap, ACallbackThatThrowsIsReportedAndDeliveryGoesOn) {
  std::atomic<int> calls{0};
  TapOptions options = Options(1, 1);
  options.on_window = [&](const TapWindow&) {
    ++calls;
    throw std::runtime_error("bug in the callback");
  };
  Fixture f(options);
  ASSERT_NE(f.tap, nullptr);
  Rows rows(12);
  for (int t = 0; t < 2; ++t) {
    ASSERT_TRUE(f.tap->Write(rows.Next(1).data(), 1).ok());
    f.tap->Step().IgnoreError();
  }
  ASSERT_TRUE(f.tap->WaitDelivered(30).ok());
  const absl::Status s = f.tap->Flush();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_NE(s.message().find("on_window threw: bug in the callback"), std::string::npos) << s;
  EXPECT_EQ(calls.load(), 2);
  ASSERT_TRUE(f.tap->Close().ok());
}

}  // namespace
}  // namespace probesidecar
