#include "client/cpp/score_pipeline.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace probesidecar::client {

// The stream: a client bidi reactor. Writes go one at a time from a queue; each read resolves
// the oldest pending request.
class ScorePipeline::Call final
    : public grpc::ClientBidiReactor<v1::ScoreRequest, v1::ScoreResponse> {
 public:
  using Answer = absl::StatusOr<v1::ScoreResponse>;
  struct Pending {
    std::promise<Answer> promise;
    std::function<void(const Answer&)> on_answer;
  };

  explicit Call(v1::ProbeSidecar::Stub& stub) {
    stub.async()->ScoreStream(&context_, this);
    StartRead(&response_);
    StartCall();
  }

  // False when the stream has ended (the caller opens another).
  bool Submit(v1::ScoreRequest request, std::shared_ptr<Pending> pending) {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return false;
    pending_.push_back(std::move(pending));
    writes_.push_back(std::move(request));
    if (!writing_) StartNextWriteLocked();
    return true;
  }

  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
    if (!writing_ && !done_) StartWritesDone();
  }

  void Cancel() { context_.TryCancel(); }

  void WaitDone() {
    std::unique_lock<std::mutex> lock(mu_);
    finished_.wait(lock, [this] { return done_; });
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok) return;  // the stream is failing: OnDone fails what is pending
    if (!writes_.empty()) {
      StartNextWriteLocked();
    } else if (closing_) {
      StartWritesDone();
    }
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended; OnDone follows
    std::shared_ptr<Pending> pending;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (pending_.empty()) return;  // an answer nobody asked for: ignored
      pending = std::move(pending_.front());
      pending_.pop_front();
    }
    Answer answer =
        response_.has_error()
            ? Answer(absl::Status(static_cast<absl::StatusCode>(response_.error().code()),
                                  response_.error().message()))
            : Answer(response_);
    if (pending->on_answer) pending->on_answer(answer);
    pending->promise.set_value(std::move(answer));
    StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override {
    std::deque<std::shared_ptr<Pending>> orphans;
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
      orphans.swap(pending_);
    }
    const absl::Status failure =
        status.ok() ? absl::UnavailableError("the stream ended") : FromGrpc(status);
    for (auto& pending : orphans) {
      if (pending->on_answer) pending->on_answer(failure);
      pending->promise.set_value(failure);
    }
    finished_.notify_all();
  }

 private:
  void StartNextWriteLocked() {
    current_ = std::move(writes_.front());
    writes_.pop_front();
    writing_ = true;
    StartWrite(&current_);
  }

  grpc::ClientContext context_;
  v1::ScoreResponse response_;
  v1::ScoreRequest current_;
  std::mutex mu_;
  std::condition_variable finished_;
  std::deque<v1::ScoreRequest> writes_;
  std::deque<std::shared_ptr<Pending>> pending_;
  bool writing_ = false;
  bool closing_ = false;
  bool done_ = false;
};

ScorePipeline::ScorePipeline(Client& client) : client_(client) {}

ScorePipeline::~ScorePipeline() {
  std::shared_ptr<Call> call;
  {
    std::lock_guard<std::mutex> lock(mu_);
    call = std::move(call_);
  }
  if (call != nullptr) {
    call->Close();
    call->WaitDone();
  }
}

std::shared_future<ScorePipeline::Answer> ScorePipeline::Submit(v1::ScoreRequest request,
                                                                std::function<void()> on_answer) {
  std::function<void(const Answer&)> wrapped;
  if (on_answer) wrapped = [on_answer = std::move(on_answer)](const Answer&) { on_answer(); };
  return Submit(std::move(request), std::move(wrapped));
}

void ScorePipeline::Cancel() {
  std::shared_ptr<Call> call;
  {
    std::lock_guard<std::mutex> lock(mu_);
    call = call_;
  }
  if (call != nullptr) call->Cancel();
}

std::shared_future<ScorePipeline::Answer> ScorePipeline::Submit(
    v1::ScoreRequest request, std::function<void(const Answer&)> on_answer) {
  auto pending = std::make_shared<Call::Pending>();
  pending->on_answer = std::move(on_answer);
  std::shared_future<absl::StatusOr<v1::ScoreResponse>> future =
      pending->promise.get_future().share();
  std::shared_ptr<Call> ended;  // a finished stream, released outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (call_ == nullptr) call_ = std::make_shared<Call>(client_.stub());
    if (call_->Submit(request, pending)) return future;
    ended = std::move(call_);  // it ended: open a new one
  }
  const Answer failure = absl::UnavailableError("could not open a ScoreStream");
  if (pending->on_answer) pending->on_answer(failure);
  pending->promise.set_value(failure);
  return future;
}

absl::Status ScoreHandle::WaitStream(cudaStream_t stream) const {
  if (!Answer().ok()) return Answer().status();
  if (cudaError_t e = cudaStreamWaitEvent(stream, done_, 0); e != cudaSuccess) {
    return absl::InternalError(absl::StrCat("cudaStreamWaitEvent: ", cudaGetErrorString(e)));
  }
  return absl::OkStatus();
}

absl::Status ScoreHandle::Wait() const {
  if (!Answer().ok()) return Answer().status();
  if (!Answer()->enqueued()) return absl::OkStatus();
  if (cudaError_t e = cudaEventSynchronize(done_); e != cudaSuccess) {
    return absl::InternalError(absl::StrCat("cudaEventSynchronize: ", cudaGetErrorString(e)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<AsyncScorer>> AsyncScorer::Create(Client& client,
                                                                 ScorePipeline& pipeline,
                                                                 uint64_t session_id,
                                                                 int events_in_flight) {
  std::unique_ptr<AsyncScorer> scorer(new AsyncScorer(pipeline, session_id));
  for (int i = 0; i < events_in_flight; ++i) {
    absl::StatusOr<IpcEvent> ready = CreateIpcEvent(client, session_id, "ready");
    if (!ready.ok()) return ready.status();
    absl::StatusOr<IpcEvent> done = CreateIpcEvent(client, session_id, "done");
    if (!done.ok()) {
      cudaEventDestroy(ready->event);
      return done.status();
    }
    scorer->pairs_.push_back({*ready, *done});
    scorer->free_.push_back(i);
  }
  return scorer;
}

AsyncScorer::~AsyncScorer() {
  for (Pair& pair : pairs_) {
    cudaEventDestroy(pair.ready.event);
    cudaEventDestroy(pair.done.event);
  }
}

ScoreHandle AsyncScorer::ScoreAsync(v1::ScoreRequest request, cudaStream_t stream) {
  int index = 0;
  {
    std::unique_lock<std::mutex> lock(mu_);
    available_.wait(lock, [this] { return !free_.empty(); });
    index = free_.back();
    free_.pop_back();
  }
  const Pair& pair = pairs_[index];
  if (cudaError_t e = cudaEventRecord(pair.ready.event, stream); e != cudaSuccess) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      free_.push_back(index);
    }
    available_.notify_one();
    std::promise<absl::StatusOr<v1::ScoreResponse>> failed;
    failed.set_value(absl::InternalError(absl::StrCat("cudaEventRecord: ", cudaGetErrorString(e))));
    return ScoreHandle(failed.get_future().share(), pair.done.event);
  }
  request.set_ready_event(pair.ready.event_id);
  request.set_done_event(pair.done.event_id);
  request.set_session_id(session_id_);
  auto answer = pipeline_.Submit(std::move(request), [this, index] {
    {
      std::lock_guard<std::mutex> lock(mu_);
      free_.push_back(index);
    }
    available_.notify_one();
  });
  return ScoreHandle(std::move(answer), pair.done.event);
}

}  // namespace probesidecar::client
