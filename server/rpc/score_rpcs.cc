// Score and ScoreStream: validation on the gRPC thread, scoring on the executor's workers, which
// finish the RPC (or write the stream's answer); both follow the skeleton of executor_rpc.h.
#include <cmath>
#include <memory>
#include <utility>

#include "server/ipc/buffer_registry.h"
#include "server/requests/score_job.h"
#include "server/rpc/executor_rpc.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/proto_conversion.h"
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

// What is particular to a Score in the skeleton of executor_rpc.h.
struct ScoreWork : ExecutorWork<v1::ScoreRequest, v1::ScoreResponse, ScoreJob, ScoreTimings> {
  static constexpr const char* kName = "Score";

  absl::StatusOr<ScoreJob> Prepare(const ServiceEnv& env, std::string* probe_set) const {
    ScoreLimits limits;
    limits.max_rows = env.config.max_rows;
    limits.max_message_bytes = env.config.max_message_bytes;
    absl::StatusOr<ScoreJob> job =
        PrepareScoreJob(*request, *env.probes, env.ipc, limits, response->mutable_scores());
    // A prepared job holds its set; a refused one is labelled only with a set that is loaded.
    if (job.ok() || env.probes->Find(request->probe_set()) != nullptr) {
      *probe_set = request->probe_set();
    }
    if (job.ok()) {
      // Its outcomes count under its session's labels (a session that is not open is refused,
      // as for a buffer).
      absl::StatusOr<int> slot = env.sessions->OutcomeSlot(request->session_id());
      if (!slot.ok()) return slot.status();
      job->outcome_slot = *slot;
    }
    return job;
  }

  void Fill(const ScoreJob& job, const ScoreTimings& timings, double seconds,
            Metrics& metrics) const {
    const ProbeSet& set = *job.probe_set;
    response->set_request_id(request->request_id());
    response->set_num_rows(job.num_rows);
    response->set_num_probes(set.num_probes);
    response->set_kernel_path(timings.kernel_path);
    response->set_precision(ToProtoPrecision(set.precision));
    response->set_enqueued(timings.enqueued);
    if (job.host_out != nullptr) {
      metrics.NonFiniteScores(FillFired(set, job.host_out, job.num_rows, response));
    } else if (timings.device_non_finite >= 0) {
      // Counted on the GPU (and in the metric by the executor); an enqueue-only request is
      // answered before the count exists: the metric alone has it.
      response->set_non_finite_scores(static_cast<int32_t>(timings.device_non_finite));
    }
    metrics.ScoreStages(set.name, timings, seconds);
  }
};

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
                           FillStreamError(status, response_.mutable_error());
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
      Finish(ToGrpcStatus(absl::CancelledError("the stream was cancelled")));
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
  static grpc::Status DrainStatus() { return ToGrpcStatus(ShuttingDown()); }

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
  RunOnExecutor(rpc, std::move(lifetime), ScoreWork{{request, response}}, std::move(finish));
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
