// probe-sidecar: the service binary. Its flags are documented in --help (server/config/config.cc).
#include "server/rpc/server.h"

int main(int argc, char** argv) { return probesidecar::server::ServerMain(argc, argv); }
