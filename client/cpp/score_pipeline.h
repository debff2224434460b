// Asynchronous scoring for a decode loop (C++): a pipelined ScoreStream, and GPU-side ordering
// through CUDA IPC events.
//
//   ScorePipeline pipeline(client);
//   AsyncScorer scorer(client, pipeline, session_id, /*events_in_flight=*/8);
//   ScoreHandle h = scorer.ScoreAsync(request, stream);  // returns at once
//   ...                                                  // the decode step goes on
//   h.WaitStream(stream);  // the stream waits on the GPU for the scores (host waits only for
//                          // the server's answer, which comes once the work is queued there)
#pragma once

#include <cuda_runtime_api.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "client/cpp/client.h"
#include "client/cpp/cuda_buffer.h"

namespace probesidecar::client {

// One ScoreStream call: Submit queues a request and returns at once; the answers come back in
// order and resolve the futures. A broken stream fails what is pending; the next Submit opens a
// new one.
class ScorePipeline {
 public:
  explicit ScorePipeline(Client& client);
  ~ScorePipeline();  // half-closes the stream and waits for the pending answers
  ScorePipeline(const ScorePipeline&) = delete;
  ScorePipeline& operator=(const ScorePipeline&) = delete;

  using Answer = absl::StatusOr<v1::ScoreResponse>;
  // `on_answer` runs on the stream's thread when the answer (or failure) arrives, before the
  // future is ready.
  std::shared_future<Answer> Submit(v1::ScoreRequest request,
                                    std::function<void()> on_answer = nullptr);
  // The same, with the answer handed to `on_answer` (the future gets it after).
  std::shared_future<Answer> Submit(v1::ScoreRequest request,
                                    std::function<void(const Answer&)> on_answer);
  // Cancels the open stream: what is pending fails (CANCELLED) and the next Submit opens a new
  // one. For a caller that gives up waiting for answers.
  void Cancel();

 private:
  class Call;
  Client& client_;
  std::mutex mu_;
  std::shared_ptr<Call> call_;  // the open stream, or null
};

// An asynchronous Score's answer.
class ScoreHandle {
 public:
  ScoreHandle(std::shared_future<absl::StatusOr<v1::ScoreResponse>> answer, cudaEvent_t done)
      : answer_(std::move(answer)), done_(done) {}
  // Waits (host) for the server's answer.
  const absl::StatusOr<v1::ScoreResponse>& Answer() const { return answer_.get(); }
  // The stream waits on the GPU until the scores are written and the inputs read.
  absl::Status WaitStream(cudaStream_t stream) const;
  // The host waits until the scores are written.
  absl::Status Wait() const;

 private:
  std::shared_future<absl::StatusOr<v1::ScoreResponse>> answer_;
  cudaEvent_t done_;
};

// Score requests ordered on the GPU with pairs of registered IPC events, one pair per request in
// flight (reused once the server has answered).
class AsyncScorer {
 public:
  // Creates and registers 2 * events_in_flight events under `session_id`.
  static absl::StatusOr<std::unique_ptr<AsyncScorer>> Create(Client& client,
                                                             ScorePipeline& pipeline,
                                                             uint64_t session_id,
                                                             int events_in_flight = 8);
  ~AsyncScorer();  // destroys the events (the server releases its side with the session)

  // Records the ready event on `stream` and submits `request` with the events set; blocks only
  // while every pair is in flight.
  ScoreHandle ScoreAsync(v1::ScoreRequest request, cudaStream_t stream);

 private:
  struct Pair {
    IpcEvent ready, done;
  };
  AsyncScorer(ScorePipeline& pipeline, uint64_t session_id)
      : pipeline_(pipeline), session_id_(session_id) {}

  ScorePipeline& pipeline_;
  const uint64_t session_id_;
  std::vector<Pair> pairs_;
  std::mutex mu_;
  std::condition_variable available_;
  std::vector<int> free_;  // indices into pairs_
};

}  // namespace probesidecar::client
