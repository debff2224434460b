#include "bench/probe_bench/probe_bench_modes.h"

#include <atomic>
#include <memory>

#include "bench/rpc/echo.grpc.pb.h"
#include "probesidecar/v1/sidecar.grpc.pb.h"

namespace probesidecar::bench {
namespace {

using EchoStub = probesidecar::bench::Echo::Stub;
using EchoRequest = probesidecar::bench::EchoRequest;
using EchoResponse = probesidecar::bench::EchoResponse;
using SidecarStub = v1::ProbeSidecar::Stub;

constexpr UnaryMethod<EchoStub, EchoRequest, EchoResponse> kEcho{&EchoStub::Echo,
                                                                 &EchoStub::async::Echo};
constexpr StreamMethod<EchoStub, EchoRequest, EchoResponse> kEchoStream{
    &EchoStub::EchoStream, &EchoStub::async::EchoStream};
constexpr UnaryMethod<SidecarStub, v1::ScoreRequest, v1::ScoreResponse> kScore{
    &SidecarStub::Score, &SidecarStub::async::Score};
constexpr StreamMethod<SidecarStub, v1::ScoreRequest, v1::ScoreResponse> kScoreStream{
    &SidecarStub::ScoreStream, &SidecarStub::async::ScoreStream};

// Every call sends `request`.
template <typename Request>
RequestsFor<Request> Same(const Request& request) {
  return [&request](int) { return [&request](int64_t) -> const Request& { return request; }; };
}

// Client `slot` starts its rotation through `good` at its own offset. A `fraction` of all calls
// of the mode, counted across its clients (an open loop's lanes carry few calls each), send one
// of `bad` instead.
RequestsFor<v1::ScoreRequest> Rotating(const std::vector<v1::ScoreRequest>& good,
                                       const std::vector<v1::ScoreRequest>& bad, double fraction) {
  auto calls = std::make_shared<std::atomic<int64_t>>(0);
  return [&good, &bad, fraction, calls](int slot) {
    return [&good, &bad, fraction, calls, slot](int64_t i) -> const v1::ScoreRequest& {
      if (fraction > 0 && IsBad(calls->fetch_add(1, std::memory_order_relaxed), fraction)) {
        return bad[(slot + i) % bad.size()];
      }
      return good[(slot + i) % good.size()];
    };
  };
}

// A ScoreStream answer carries the status of its own message.
grpc::Status StreamedScoreStatus(const v1::ScoreResponse& response) {
  if (!response.has_error()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(response.error().code()),
                      response.error().message());
}

grpc::Status EchoOk(const EchoResponse&) { return grpc::Status::OK; }

CallMaker Echo(const Workload& w, double timeout) { return Unary(kEcho, Same(w.echo), timeout); }

CallMaker EchoStream(const Workload& w, double timeout) {
  return PingPong(kEchoStream, Same(w.echo), Check<EchoResponse>(EchoOk), timeout);
}

CallMaker ScoreIpc(const Workload& w, double timeout) {
  return Unary(kScore, Rotating(w.ipc_requests, w.ipc_bad, w.bad_fraction), timeout);
}

CallMaker ScoreInline(const Workload& w, double timeout) {
  return Unary(kScore, Rotating(w.inline_requests, w.inline_bad, w.bad_fraction), timeout);
}

CallMaker ScoreStream(const Workload& w, double timeout) {
  return PingPong(kScoreStream, Rotating(w.inline_requests, w.inline_bad, w.bad_fraction),
                  Check<v1::ScoreResponse>(StreamedScoreStatus), timeout);
}

CallMaker ScoreStreamIpc(const Workload& w, double timeout) {
  return PingPong(kScoreStream, Rotating(w.ipc_requests, w.ipc_bad, w.bad_fraction),
                  Check<v1::ScoreResponse>(StreamedScoreStatus), timeout);
}

size_t EchoBytes(const Workload& w) { return w.echo.ByteSizeLong(); }
size_t IpcBytes(const Workload& w) { return w.ipc_requests[0].ByteSizeLong(); }
size_t InlineBytes(const Workload& w) { return w.inline_requests[0].ByteSizeLong(); }

constexpr ModeInfo kModes[] = {
    {"echo", "unary Echo on the echo server (the score_ipc request's size)", true, false, Echo,
     EchoBytes},
    {"echo_stream", "ping-pong on one EchoStream per client (bidi floor)", true, false, EchoStream,
     EchoBytes},
    {"score_ipc", "unary Score, activations registered over CUDA IPC", false, true, ScoreIpc,
     IpcBytes},
    {"score_inline", "unary Score, the R rows sent inline", false, false, ScoreInline, InlineBytes},
    {"score_stream", "ping-pong on one ScoreStream per client, rows inline", false, false,
     ScoreStream, InlineBytes},
    {"score_stream_ipc", "ping-pong on one ScoreStream per client, CUDA IPC", false, true,
     ScoreStreamIpc, IpcBytes},
};

}  // namespace

const ModeInfo* FindMode(const std::string& name) {
  for (const ModeInfo& mode : kModes) {
    if (name == mode.name) return &mode;
  }
  return nullptr;
}

std::vector<std::string> ModeNames() {
  std::vector<std::string> names;
  for (const ModeInfo& mode : kModes) names.push_back(mode.name);
  return names;
}

}  // namespace probesidecar::bench
