// The two shapes of call every probe-bench mode is made of — a unary call, and one message of a
// ping-pong bidi stream (send, wait for the answer, send ...) — each in the two forms the load
// generators use: blocking (closed loop: a thread per client) and started (open loop: a lane
// that carries one call at a time, answered on a gRPC thread).
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/client_callback.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace probesidecar::bench {

using Done = std::function<void(const grpc::Status&)>;

// Closed loop: one per client thread, one call at a time.
class BlockingCaller {
 public:
  virtual ~BlockingCaller() = default;
  virtual grpc::Status Call() = 0;
  // Ends a call still blocked after the run (streams have no per-call deadline). Thread-safe.
  virtual void Cancel() {}
};

// Open loop: carries at most one call at a time; Start returns at once and `done` runs on a gRPC
// thread when the call is answered.
class Lane {
 public:
  virtual ~Lane() = default;
  virtual void Start(Done done) = 0;
  // Ends a call still in flight after the run. Not concurrent with Start.
  virtual void Cancel() {}
};

// Call number `i` of one client thread or lane sends the request this returns; the request must
// stay alive for the whole run.
template <typename Request>
using Requests = std::function<const Request&(int64_t i)>;
// The request source of client thread or lane `slot`.
template <typename Request>
using RequestsFor = std::function<Requests<Request>(int slot)>;
// A streamed answer may carry an error of its own.
template <typename Response>
using Check = std::function<grpc::Status(const Response&)>;

// What a mode gives the load generators: callers and lanes on a given channel.
struct CallMaker {
  std::function<std::unique_ptr<BlockingCaller>(std::shared_ptr<grpc::Channel>, int slot)> blocking;
  std::function<std::unique_ptr<Lane>(std::shared_ptr<grpc::Channel>, int slot)> lane;
};

inline void SetDeadline(grpc::ClientContext& context, double timeout_seconds) {
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::microseconds(static_cast<int64_t>(timeout_seconds * 1e6)));
}

// What every caller and lane of a mode holds: a stub on its channel (built in place: a generated
// stub must not be copied), the RPC's methods, and its request source.
template <typename Stub, typename Method, typename Request>
struct CallTarget {
  CallTarget(std::shared_ptr<grpc::Channel> channel, Method m, Requests<Request> r)
      : stub(std::move(channel)), method(m), requests(std::move(r)) {}
  const Request& NextRequest() { return requests(next++); }

  Stub stub;
  const Method method;
  const Requests<Request> requests;
  int64_t next = 0;
};

// --- unary ----------------------------------------------------------------------------------

template <typename Stub, typename Request, typename Response>
struct UnaryMethod {
  grpc::Status (Stub::*call)(grpc::ClientContext*, const Request&, Response*);
  void (Stub::async::*start)(grpc::ClientContext*, const Request*, Response*,
                             std::function<void(grpc::Status)>);
};

template <typename Stub, typename Request, typename Response>
class UnaryBlocking final : public BlockingCaller {
 public:
  using Method = UnaryMethod<Stub, Request, Response>;
  UnaryBlocking(std::shared_ptr<grpc::Channel> channel, Method m, Requests<Request> requests,
                double timeout_seconds)
      : target_(std::move(channel), m, std::move(requests)), timeout_(timeout_seconds) {}

  grpc::Status Call() override {
    grpc::ClientContext context;
    SetDeadline(context, timeout_);
    response_.Clear();
    return (target_.stub.*target_.method.call)(&context, target_.NextRequest(), &response_);
  }

 private:
  CallTarget<Stub, Method, Request> target_;
  const double timeout_;
  Response response_;
};

template <typename Stub, typename Request, typename Response>
class UnaryLane final : public Lane {
 public:
  using Method = UnaryMethod<Stub, Request, Response>;
  UnaryLane(std::shared_ptr<grpc::Channel> channel, Method m, Requests<Request> requests,
            double timeout_seconds)
      : target_(std::move(channel), m, std::move(requests)), timeout_(timeout_seconds) {}

  void Start(Done done) override {
    // A context per call; the previous one is done with once its callback has run.
    context_ = std::make_unique<grpc::ClientContext>();
    SetDeadline(*context_, timeout_);
    response_.Clear();
    (target_.stub.async()->*target_.method.start)(
        context_.get(), &target_.NextRequest(), &response_,
        [done = std::move(done)](grpc::Status s) { done(s); });
  }

  void Cancel() override {
    if (context_ != nullptr) context_->TryCancel();
  }

 private:
  CallTarget<Stub, Method, Request> target_;
  const double timeout_;
  std::unique_ptr<grpc::ClientContext> context_;
  Response response_;
};

template <typename Stub, typename Request, typename Response>
CallMaker Unary(UnaryMethod<Stub, Request, Response> m, RequestsFor<Request> requests,
                double timeout_seconds) {
  return {[=](std::shared_ptr<grpc::Channel> channel, int slot) -> std::unique_ptr<BlockingCaller> {
            return std::make_unique<UnaryBlocking<Stub, Request, Response>>(
                std::move(channel), m, requests(slot), timeout_seconds);
          },
          [=](std::shared_ptr<grpc::Channel> channel, int slot) -> std::unique_ptr<Lane> {
            return std::make_unique<UnaryLane<Stub, Request, Response>>(
                std::move(channel), m, requests(slot), timeout_seconds);
          }};
}

// --- ping-pong on a bidi stream -------------------------------------------------------------

// A stream that breaks (its send or receive fails) reports the stream's status for the message
// in flight, and the next call opens a new stream.
inline grpc::Status StreamEndStatus(const grpc::Status& status) {
  return status.ok() ? grpc::Status(grpc::StatusCode::UNKNOWN, "the stream ended without an answer")
                     : status;
}

template <typename Stub, typename Request, typename Response>
struct StreamMethod {
  std::unique_ptr<grpc::ClientReaderWriter<Request, Response>> (Stub::*open)(grpc::ClientContext*);
  void (Stub::async::*start)(grpc::ClientContext*, grpc::ClientBidiReactor<Request, Response>*);
};

template <typename Stub, typename Request, typename Response>
class PingPongBlocking final : public BlockingCaller {
 public:
  using Method = StreamMethod<Stub, Request, Response>;
  PingPongBlocking(std::shared_ptr<grpc::Channel> channel, Method m, Requests<Request> requests,
                   Check<Response> check)
      : target_(std::move(channel), m, std::move(requests)), check_(std::move(check)) {}

  ~PingPongBlocking() override {
    if (stream_ == nullptr) return;
    stream_->WritesDone();
    stream_->Finish().IgnoreError();
  }

  grpc::Status Call() override {
    if (stream_ == nullptr) {
      absl::MutexLock lock(&mu_);
      context_ = std::make_unique<grpc::ClientContext>();
      stream_ = (target_.stub.*target_.method.open)(context_.get());
    }
    response_.Clear();
    if (stream_->Write(target_.NextRequest()) && stream_->Read(&response_)) {
      return check_(response_);
    }
    const grpc::Status status = StreamEndStatus(stream_->Finish());
    absl::MutexLock lock(&mu_);
    stream_.reset();
    context_.reset();
    return status;
  }

  void Cancel() override {
    absl::MutexLock lock(&mu_);
    if (context_ != nullptr) context_->TryCancel();
  }

 private:
  CallTarget<Stub, Method, Request> target_;
  const Check<Response> check_;
  absl::Mutex mu_;  // context_ is replaced by Call and cancelled from another thread
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientReaderWriter<Request, Response>> stream_;
  Response response_;
};

// One stream of a lane. A hold keeps the stream's end (OnDone) from racing with the next Send;
// it is released when the stream breaks or is closed.
template <typename Stub, typename Request, typename Response>
class PingPongReactor final : public grpc::ClientBidiReactor<Request, Response> {
 public:
  PingPongReactor(Stub& stub, StreamMethod<Stub, Request, Response> m, Check<Response> check)
      : check_(std::move(check)) {
    (stub.async()->*m.start)(&context_, this);
    this->AddHold();
    this->StartCall();
  }

  bool broken() {
    absl::MutexLock lock(&mu_);
    return broken_;
  }

  void Send(const Request& request, Done done) {
    {
      absl::MutexLock lock(&mu_);
      done_ = std::move(done);
      pending_ = 2;
    }
    response_.Clear();
    this->StartRead(&response_);
    this->StartWrite(&request);
  }

  // Half-closes an idle stream and waits for its end (cancelling it after `timeout`).
  void Close(absl::Duration timeout) {
    bool broken;
    {
      absl::MutexLock lock(&mu_);
      broken = broken_;
    }
    if (!broken) {
      this->StartWritesDone();
      this->RemoveHold();
    }
    absl::MutexLock lock(&mu_);
    if (!mu_.AwaitWithTimeout(absl::Condition(&finished_), timeout)) {
      context_.TryCancel();
      mu_.Await(absl::Condition(&finished_));
    }
  }

  void Cancel() { context_.TryCancel(); }

  void OnWriteDone(bool ok) override { Step(ok); }
  void OnReadDone(bool ok) override { Step(ok); }

  void OnDone(const grpc::Status& status) override {
    Done done;
    {
      absl::MutexLock lock(&mu_);
      finished_ = true;
      if (awaiting_status_) done = std::move(done_);
    }
    // Nothing of this object is touched after `done`: it may return the lane to the pool.
    if (done) done(StreamEndStatus(status));
  }

 private:
  // Both halves of a message (its send and its answer) have completed once pending_ reaches 0.
  void Step(bool ok) {
    Done done;
    {
      absl::MutexLock lock(&mu_);
      failed_ |= !ok;
      if (--pending_ > 0) return;
      if (failed_) {
        broken_ = true;
        awaiting_status_ = true;  // OnDone answers with the stream's status
      } else {
        done = std::move(done_);
      }
    }
    if (done) {
      done(check_(response_));
    } else {
      this->RemoveHold();
    }
  }

  const Check<Response> check_;
  grpc::ClientContext context_;
  Response response_;
  absl::Mutex mu_;
  Done done_ ABSL_GUARDED_BY(mu_);
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool awaiting_status_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

template <typename Stub, typename Request, typename Response>
class PingPongLane final : public Lane {
 public:
  using Method = StreamMethod<Stub, Request, Response>;
  using Reactor = PingPongReactor<Stub, Request, Response>;

  PingPongLane(std::shared_ptr<grpc::Channel> channel, Method m, Requests<Request> requests,
               Check<Response> check, double timeout_seconds)
      : target_(std::move(channel), m, std::move(requests)),
        check_(std::move(check)),
        timeout_(absl::Seconds(timeout_seconds)),
        reactor_(std::make_unique<Reactor>(target_.stub, m, check_)) {}

  ~PingPongLane() override {
    reactor_->Close(timeout_);
    for (auto& broken : broken_) broken->Close(timeout_);
  }

  void Start(Done done) override {
    if (reactor_->broken()) {
      broken_.push_back(std::move(reactor_));
      reactor_ = std::make_unique<Reactor>(target_.stub, target_.method, check_);
    }
    reactor_->Send(target_.NextRequest(), std::move(done));
  }

  void Cancel() override { reactor_->Cancel(); }

 private:
  CallTarget<Stub, Method, Request> target_;
  const Check<Response> check_;
  const absl::Duration timeout_;
  std::unique_ptr<Reactor> reactor_;
  std::vector<std::unique_ptr<Reactor>> broken_;  // ended; kept until the lane goes
};

template <typename Stub, typename Request, typename Response>
CallMaker PingPong(StreamMethod<Stub, Request, Response> m, RequestsFor<Request> requests,
                   Check<Response> check, double timeout_seconds) {
  return {[=](std::shared_ptr<grpc::Channel> channel, int slot) -> std::unique_ptr<BlockingCaller> {
            return std::make_unique<PingPongBlocking<Stub, Request, Response>>(
                std::move(channel), m, requests(slot), check);
          },
          [=](std::shared_ptr<grpc::Channel> channel, int slot) -> std::unique_ptr<Lane> {
            return std::make_unique<PingPongLane<Stub, Request, Response>>(
                std::move(channel), m, requests(slot), check, timeout_seconds);
          }};
}

}  // namespace probesidecar::bench
