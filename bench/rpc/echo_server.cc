// probe-echo-server: the bare gRPC echo used as the baseline of the RPC benchmark. Same gRPC
// library, callback API, message limits and listeners as probe-sidecar; no work per call.
//
//   probe-echo-server --listen=unix:/tmp/echo.sock --listen=127.0.0.1:0
#include <signal.h>

#include <cstdio>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "bench/rpc/echo.grpc.pb.h"

namespace {

class EchoService final : public probesidecar::bench::Echo::CallbackService {
  grpc::ServerUnaryReactor* Echo(grpc::CallbackServerContext* context,
                                 const probesidecar::bench::EchoRequest* request,
                                 probesidecar::bench::EchoResponse* response) override {
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
    bound += (i ? ", " : "") +
             (a.rfind("unix:", 0) == 0 ? a : a.substr(0, a.rfind(':')) + ":" + std::to_string(ports[i]));
  }
  std::fprintf(stderr, "probe-echo-server serving on %s\n", bound.c_str());
  int sig = 0;
  sigwait(&signals, &sig);
  server->Shutdown();
  return 0;
}
