// probe-echo-server: the bare gRPC echo used as the baseline of the RPC benchmark. Same gRPC
// library, callback API, message limits and listeners as probe-sidecar; no work per call.
//
//   probe-echo-server --listen=unix:/tmp/echo.sock --listen=127.0.0.1:0
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/rpc/echo.grpc.pb.h"

namespace {

using probesidecar::bench::EchoRequest;
using probesidecar::bench::EchoResponse;

// EchoStream: read, answer, read ... one message at a time, as ScoreStream does.
class EchoStreamReactor final : public grpc::ServerBidiReactor<EchoRequest, EchoResponse> {
 public:
  EchoStreamReactor() { StartRead(&request_); }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client half-closed (or the call ended)
      Finish(grpc::Status::OK);
      return;
    }
    response_.mutable_payload()->assign(request_.response_bytes(), 'e');
    StartWrite(&response_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the stream was cancelled"));
      return;
    }
    StartRead(&request_);
  }

  void OnDone() override { delete this; }

 private:
  EchoRequest request_;
  EchoResponse response_;
};

class EchoService final : public probesidecar::bench::Echo::CallbackService {
  grpc::ServerBidiReactor<EchoRequest, EchoResponse>* EchoStream(
      grpc::CallbackServerContext* /*context*/) override {
    return new EchoStreamReactor();
  }

  grpc::ServerUnaryReactor* Echo(grpc::CallbackServerContext* context, const EchoRequest* request,
                                 EchoResponse* response) override {
    response->mutable_payload()->resize(request->response_bytes(), 'e');
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> listen;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--listen=", 0) == 0) {
      listen.push_back(arg.substr(9));
    } else {
      std::fprintf(stderr, "usage: probe-echo-server --listen=ADDR [--listen=ADDR ...]\n");
      return 2;
    }
  }
  if (listen.empty()) listen.push_back("127.0.0.1:0");
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  EchoService service;
  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(1 << 30);
  builder.SetMaxSendMessageSize(1 << 30);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  std::vector<int> ports(listen.size(), 0);
  for (size_t i = 0; i < listen.size(); ++i) {
    builder.AddListeningPort(listen[i], grpc::InsecureServerCredentials(), &ports[i]);
  }
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) {
    std::fprintf(stderr, "probe-echo-server: cannot listen\n");
    return 1;
  }
  std::string bound;
  for (size_t i = 0; i < listen.size(); ++i) {
    const std::string& a = listen[i];
    bound +=
        (i ? ", " : "") +
        (a.rfind("unix:", 0) == 0 ? a : a.substr(0, a.rfind(':')) + ":" + std::to_string(ports[i]));
  }
  std::fprintf(stderr, "probe-echo-server serving on %s\n", bound.c_str());
  int sig = 0;
  sigwait(&signals, &sig);
  // Open streams are cancelled after a second.
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  return 0;
}
