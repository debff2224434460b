// Starting, running and stopping the service.
#pragma once

#include <memory>

#include "absl/functional/any_invocable.h"
#include "server/config/config.h"
#include "server/executors/executor.h"

namespace probesidecar::server {

// Wraps the executor the flags chose (test binaries only: e.g. the fault injector); empty: none.
using ExecutorDecorator =
    absl::AnyInvocable<std::unique_ptr<Executor>(std::unique_ptr<Executor> executor)>;

// Runs until SIGINT or SIGTERM, then lets in-flight RPCs finish (up to the grace period) and
// returns 0; returns 1 when it cannot start (the reason is logged). The calling thread must be
// the process's first thread: it blocks the signals for every thread it starts.
int RunServer(const Config& config, ExecutorDecorator decorate = nullptr);

// main(): parses the flags (--help, --version), then RunServer. Returns the exit status.
int ServerMain(int argc, char** argv, ExecutorDecorator decorate = nullptr);

}  // namespace probesidecar::server
