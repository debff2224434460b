// Starting, running and stopping the service.
#pragma once

#include "server/config/config.h"

namespace probesidecar::server {

// Runs until SIGINT or SIGTERM, then lets in-flight RPCs finish (up to the grace period) and
// returns 0; returns 1 when it cannot start (the reason is logged). The calling thread must be
// the process's first thread: it blocks the signals for every thread it starts.
int RunServer(const Config& config);

}  // namespace probesidecar::server
