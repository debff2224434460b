#include "bench/probe_bench/probe_bench_load.h"

#include <sys/prctl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bench/probe_bench/probe_bench_progress.h"

namespace probesidecar::bench {
namespace {

using Clock = std::chrono::steady_clock;

double MicrosBetween(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::micro>(to - from).count();
}

Clock::duration Seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// A connection of its own (a local subchannel pool), as a separate process would have, connected
// before the run so that no measured call pays for the connection.
absl::StatusOr<std::shared_ptr<grpc::Channel>> Connect(const std::string& target,
                                                       double timeout_seconds) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(1 << 30);
  args.SetMaxSendMessageSize(1 << 30);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  if (!channel->WaitForConnected(
          std::chrono::system_clock::now() +
          std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1e3)))) {
    return absl::UnavailableError(
        absl::StrCat("cannot connect to ", target, " within ", timeout_seconds, " s"));
  }
  return channel;
}

absl::StatusOr<std::vector<std::shared_ptr<grpc::Channel>>> ConnectAll(const std::string& target,
                                                                       int count,
                                                                       double timeout_seconds) {
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < count; ++i) {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = Connect(target, timeout_seconds);
    if (!channel.ok()) return channel.status();
    channels.push_back(*std::move(channel));
  }
  return channels;
}

// Sleeps with a 1 ns timer slack (the default, 50 us, would delay every scheduled send).
class PreciseSleep {
 public:
  PreciseSleep() : saved_(prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0)) {
    prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0);
  }
  ~PreciseSleep() {
    if (saved_ > 0) prctl(PR_SET_TIMERSLACK, saved_, 0, 0, 0);
  }
  void Until(Clock::time_point t) const { std::this_thread::sleep_until(t); }

 private:
  const int saved_;
};

// The lanes of an open loop: which are free (taken in turn, so that calls spread over the
// connections), and when the last answer came.
class LanePool {
 public:
  explicit LanePool(int lanes) : total_(lanes) {
    for (int i = 0; i < lanes; ++i) free_.push_back(i);
  }
  // A free lane, or -1.
  int Take() {
    absl::MutexLock lock(&mu_);
    if (free_.empty()) return -1;
    const int lane = free_.front();
    free_.pop_front();
    return lane;
  }
  void Give(int lane, Clock::time_point answered) {
    absl::MutexLock lock(&mu_);
    free_.push_back(lane);
    last_answer_ = std::max(last_answer_, answered);
  }
  // Waits until every lane is free; false on timeout.
  bool AwaitAllFree(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto all_free = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return static_cast<int>(free_.size()) == total_;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&all_free), timeout);
  }
  Clock::time_point last_answer() {
    absl::MutexLock lock(&mu_);
    return last_answer_;
  }

 private:
  const int total_;
  absl::Mutex mu_;
  std::deque<int> free_ ABSL_GUARDED_BY(mu_);
  Clock::time_point last_answer_ ABSL_GUARDED_BY(mu_){};
};

}  // namespace

std::vector<double> SendTimes(double rate, double seconds, Arrivals arrivals, uint64_t seed) {
  std::vector<double> times;
  if (arrivals == Arrivals::kConstant) {
    for (int64_t i = 0; i / rate < seconds; ++i) times.push_back(i / rate);
    return times;
  }
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(rate);
  for (double t = gap(rng); t < seconds; t += gap(rng)) times.push_back(t);
  return times;
}

absl::StatusOr<Measurement> RunClosedLoop(const CallMaker& calls, const std::string& target,
                                          int concurrency, const LoadSettings& settings) {
  absl::StatusOr<std::vector<std::shared_ptr<grpc::Channel>>> channels =
      ConnectAll(target, concurrency, settings.timeout_seconds);
  if (!channels.ok()) return channels.status();
  std::vector<std::unique_ptr<BlockingCaller>> callers;
  for (int t = 0; t < concurrency; ++t) callers.push_back(calls.blocking((*channels)[t], t));

  Recorder recorder;
  std::atomic<int64_t> sent{0};
  std::atomic<bool> warmup_cancelled{false};
  absl::Mutex mu;
  int warm = 0, finished = 0;
  bool go = false;
  Clock::time_point end;  // written before go
  std::vector<std::thread> threads;
  for (int t = 0; t < concurrency; ++t) {
    threads.emplace_back([&, t] {
      BlockingCaller& caller = *callers[t];
      for (int i = 0; i < settings.warmup && !warmup_cancelled; ++i) caller.Call().IgnoreError();
      {
        absl::MutexLock lock(&mu);
        ++warm;
        mu.Await(absl::Condition(&go));
      }
      for (Clock::time_point begin = Clock::now(); begin < end; begin = Clock::now()) {
        ++sent;
        const grpc::Status status = caller.Call();
        recorder.Add(MicrosBetween(begin, Clock::now()), status);
      }
      absl::MutexLock lock(&mu);
      ++finished;
    });
  }
  auto all_warm = [&] { return warm == concurrency; };
  auto all_finished = [&] { return finished == concurrency; };
  Clock::time_point start;
  {
    absl::MutexLock lock(&mu);
    if (!mu.AwaitWithTimeout(absl::Condition(&all_warm), absl::Seconds(settings.timeout_seconds))) {
      warmup_cancelled = true;
      do {
        for (auto& caller : callers) caller->Cancel();  // a stream that never answered
      } while (!mu.AwaitWithTimeout(absl::Condition(&all_warm), absl::Seconds(1)));
    }
    start = Clock::now();
    end = start + Seconds(settings.seconds);
    go = true;
  }
  {
    Progress progress(
        settings.title, recorder, [&] { return sent.load(); }, settings.progress);
    absl::MutexLock lock(&mu);
    if (!mu.AwaitWithTimeout(absl::Condition(&all_finished),
                             absl::Seconds(settings.seconds + settings.timeout_seconds))) {
      for (auto& caller : callers) caller->Cancel();  // a stream that stopped answering
    }
  }
  for (std::thread& thread : threads) thread.join();
  Measurement m;
  m.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  m.calls = recorder.Take();
  return m;
}

absl::StatusOr<Measurement> RunOpenLoop(const CallMaker& calls, const std::string& target,
                                        double rate, const LoadSettings& settings) {
  absl::StatusOr<std::vector<std::shared_ptr<grpc::Channel>>> channels =
      ConnectAll(target, settings.connections, settings.timeout_seconds);
  if (!channels.ok()) return channels.status();
  const int num_lanes = settings.max_outstanding;
  std::vector<std::unique_ptr<Lane>> lanes;
  for (int i = 0; i < num_lanes; ++i) {
    lanes.push_back(calls.lane((*channels)[i % channels->size()], i));
  }
  LanePool pool(num_lanes);
  const absl::Duration timeout = absl::Seconds(settings.timeout_seconds);

  // Warm-up: one call at a time, the lanes in turn.
  for (int i = 0; i < settings.warmup; ++i) {
    const int lane = pool.Take();
    lanes[lane]->Start([&pool, lane](const grpc::Status&) { pool.Give(lane, Clock::now()); });
    if (!pool.AwaitAllFree(timeout)) break;  // the drain below cancels it
  }

  Recorder recorder;
  std::atomic<int64_t> sent{0};
  const std::vector<double> send_times =
      SendTimes(rate, settings.seconds, settings.arrivals, settings.seed);
  Measurement m;
  m.scheduled = static_cast<int64_t>(send_times.size());
  m.offered_rps = m.scheduled / settings.seconds;
  m.send_lag_us.reserve(send_times.size());
  const Clock::time_point start = Clock::now() + std::chrono::milliseconds(1);
  {
    Progress progress(
        settings.title, recorder, [&] { return sent.load(); }, settings.progress);
    PreciseSleep sleep;
    for (double offset : send_times) {
      const Clock::time_point due = start + Seconds(offset);
      sleep.Until(due);
      const int lane = pool.Take();
      if (lane < 0) {
        ++m.not_sent;  // --max-outstanding calls in flight
        continue;
      }
      m.send_lag_us.push_back(MicrosBetween(due, Clock::now()));
      ++sent;
      lanes[lane]->Start([&recorder, &pool, lane, due](const grpc::Status& status) {
        const Clock::time_point now = Clock::now();
        recorder.Add(MicrosBetween(due, now), status);
        pool.Give(lane, now);
      });
    }
    // A unary call ends by its deadline on its own (DEADLINE_EXCEEDED); the slack lets its timer
    // fire on a busy host rather than cancelling the call here, which would count it CANCELLED.
    // What is still in flight after it (streams have no per-call deadline) is cancelled.
    if (!pool.AwaitAllFree(timeout + absl::Seconds(1))) {
      for (auto& lane : lanes) lane->Cancel();  // answered as CANCELLED
      pool.AwaitAllFree(absl::InfiniteDuration());
    }
  }
  lanes.clear();  // closes the streams
  std::sort(m.send_lag_us.begin(), m.send_lag_us.end());
  m.calls = recorder.Take();
  const Clock::time_point last = pool.last_answer();
  m.seconds = m.calls.calls() > 0 && last > start
                  ? std::chrono::duration<double>(last - start).count()
                  : settings.seconds;
  return m;
}

}  // namespace probesidecar::bench
