// Score and ScoreStream: validation on the gRPC thread, scoring on the executor's workers, which
// finish the RPC (or write the stream's answer).
#include <cmath>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/buffers/buffer_registry.h"
#include "server/observability/log.h"
#include "server/requests/score_job.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/rpc_helpers.h"
#include "server/rpc/service.h"

namespace probesidecar::server {
namespace {

// Flat indices r * P + p of the finite scores at or above their probe's threshold (a NaN or
// infinite score comes from input that was not finite: it never fires), and the count of scores
// that are not finite, which is returned.
int32_t FillFired(const ProbeSet& set, const float* scores, int32_t num_rows,
                  v1::ScoreResponse* response) {
  int32_t non_finite = 0;
  for (int32_t r = 0; r < num_rows; ++r) {
    for (int32_t p = 0; p < set.num_probes; ++p) {
      const std::optional<float>& threshold = set.probes[p].threshold;
      const int64_t index = static_cast<int64_t>(r) * set.num_probes + p;
      if (!std::isfinite(scores[index])) {
        ++non_finite;
        continue;
      }
      if (threshold.has_value() && scores[index] >= *threshold) {
        response->add_fired(static_cast<int32_t>(index));
      }
    }
  }
  response->set_non_finite_scores(non_finite);
  return non_finite;
}

// ScoreStream: one message at a time (read, score, write, read ...), so responses come back in
// request order and a slow client cannot queue unbounded work. On drain, an idle stream ends at
// once with UNAVAILABLE and a busy one right after its current answer.
class ScoreStreamReactor final
    : public grpc::ServerBidiReactor<v1::ScoreRequest, v1::ScoreResponse>,
      public DrainableStream {
 public:
  ScoreStreamReactor(ProbeSidecarService* service, grpc::CallbackServerContext* context)
      : service_(service), context_(context) {
    service_->AddStream(this);
    StartRead(&request_);
  }

  void Drain() override {
    {
      absl::MutexLock lock(&mu_);
      draining_ = true;
      if (busy_ || finished_) return;
      finished_ = true;
    }
    // The pending read then completes with ok=false.
    Finish(DrainStatus());
  }

  void OnReadDone(bool ok) override {
    bool drain = false;
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      drain = draining_;
      if (!ok || drain) {
        finished_ = true;
      } else {
        busy_ = true;
      }
    }
    if (!ok) {
      // The client half-closed (or the call ended): nothing is in flight.
      Finish(grpc::Status::OK);
      return;
    }
    if (drain) {
      Finish(DrainStatus());
      return;
    }
    response_.Clear();
    service_->RunScore(Rpc::kScoreStream, LifetimeOf(context_), &request_, &response_,
                       [this](const absl::Status& status) {
                         if (!status.ok()) {
                           response_.Clear();
                           response_.set_request_id(request_.request_id());
                           response_.mutable_error()->set_code(status.raw_code());
                           response_.mutable_error()->set_message(std::string(status.message()));
                         }
                         StartWrite(&response_);
                       });
  }

  void OnWriteDone(bool ok) override {
    bool drain;
    {
      absl::MutexLock lock(&mu_);
      busy_ = false;
      drain = draining_;
      if (!ok || drain) finished_ = true;
    }
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the stream was cancelled"));
    } else if (drain) {
      Finish(DrainStatus());
    } else {
      StartRead(&request_);
    }
  }

  void OnDone() override {
    service_->RemoveStream(this);
    delete this;
  }

 private:
  static grpc::Status DrainStatus() {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down");
  }

  ProbeSidecarService* const service_;
  grpc::CallbackServerContext* const context_;
  v1::ScoreRequest request_;
  v1::ScoreResponse response_;
  absl::Mutex mu_;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;  // a message is being scored or written
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // Finish was called (or decided)
};

}  // namespace

void ProbeSidecarService::RunScore(Rpc rpc, RequestLifetime lifetime,
                                   const v1::ScoreRequest* request, v1::ScoreResponse* response,
                                   Finish finish) {
  const Clock::time_point start = Clock::now();
  env_.metrics->RpcStarted(rpc);
  auto fail = [&](const absl::Status& status, absl::string_view probe_set) {
    env_.metrics->RpcFinished(rpc, status.code(), SecondsSince(start), probe_set, "");
    std::move(finish)(status);
  };
  if (absl::Status draining = Draining(); !draining.ok()) {
    fail(draining, "");
    return;
  }
  if (absl::Status alive = lifetime.Check(); !alive.ok()) {
    fail(alive, "");
    return;
  }
  if (admitted_.fetch_add(1) >= env_.config.max_concurrent_requests) {
    admitted_.fetch_sub(1);
    fail(absl::ResourceExhaustedError(
             absl::StrCat("the server is at its limit of ", env_.config.max_concurrent_requests,
                          " requests in progress (--max-concurrent-requests); retry later")),
         "");
    return;
  }
  ScoreLimits limits;
  limits.max_rows = env_.config.max_rows;
  limits.max_message_bytes = env_.config.max_message_bytes;
  absl::StatusOr<ScoreJob> prepared = PrepareScoreJob(
      *request, *env_.probes, env_.executor->buffers(), limits, response->mutable_scores());
  if (!prepared.ok()) {
    admitted_.fetch_sub(1);
    // Label only with names that are loaded: a client must not be able to grow the label set.
    const bool known = env_.probes->Find(request->probe_set()) != nullptr;
    fail(prepared.status(), known ? absl::string_view(request->probe_set()) : "");
    return;
  }
  auto job = std::make_unique<ScoreJob>(std::move(*prepared));
  job->lifetime = std::move(lifetime);
  const ScoreJob* raw_job = job.get();
  in_flight_.fetch_add(1);
  env_.executor->Score(raw_job, [this, rpc, start, request, response, job = std::move(job),
                                 finish = std::move(finish)](absl::Status status,
                                                             const ScoreTimings& timings) mutable {
    const ProbeSet& set = *job->probe_set;
    // Done, but past the deadline or with the caller gone nobody gets the answer: it is counted
    // as what the caller saw.
    if (status.ok()) status = job->lifetime.Check();
    if (status.ok()) {
      response->set_request_id(request->request_id());
      response->set_num_rows(job->num_rows);
      response->set_num_probes(set.num_probes);
      response->set_kernel_path(timings.kernel_path);
      response->set_precision(ToProtoPrecision(set.precision));
      response->set_enqueued(timings.enqueued);
      if (job->host_out != nullptr) {
        env_.metrics->NonFiniteScores(FillFired(set, job->host_out, job->num_rows, response));
      } else if (timings.device_non_finite >= 0) {
        // Counted on the GPU (and in the metric by the executor); an enqueue-only request is
        // answered before the count exists: the metric alone has it.
        response->set_non_finite_scores(static_cast<int32_t>(timings.device_non_finite));
      }
      env_.metrics->ScoreStages(set.name, timings, SecondsSince(start));
    } else if (status.code() == absl::StatusCode::kInternal) {
      env_.metrics->CudaError();
      LogError("Score on probe set '%s' failed: %s", set.name, status.ToString());
    }
    const std::string probe_set = set.name;
    job.reset();  // releases buffer leases before the answer goes out
    admitted_.fetch_sub(1);
    env_.metrics->RpcFinished(rpc, status.code(), SecondsSince(start), probe_set,
                              timings.kernel_path);
    std::move(finish)(status);
    in_flight_.fetch_sub(1);  // after the answer: drain waits for it
  });
}

grpc::ServerUnaryReactor* ProbeSidecarService::Score(grpc::CallbackServerContext* context,
                                                     const v1::ScoreRequest* request,
                                                     v1::ScoreResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  RunScore(Rpc::kScore, LifetimeOf(context), request, response,
           [reactor](const absl::Status& status) { reactor->Finish(ToGrpcStatus(status)); });
  return reactor;
}

grpc::ServerBidiReactor<v1::ScoreRequest, v1::ScoreResponse>* ProbeSidecarService::ScoreStream(
    grpc::CallbackServerContext* context) {
  return new ScoreStreamReactor(this, context);
}

}  // namespace probesidecar::server
