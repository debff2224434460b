// Stopping the /metrics endpoint (prometheus-cpp's Exposer, on civetweb) without its idle wait.
#pragma once

#include <memory>
#include <string>

#include "prometheus/exposer.h"

namespace probesidecar::server {

// Destroys `exposer`, which listens on `host` (as given to --metrics-listen, wildcards included).
//
// civetweb stops its listener thread only between two polls of the listening socket, which it
// makes 2 s apart: an idle Exposer took up to 2 s to destroy, after everything else had stopped.
// Connecting to the endpoint while it stops wakes that poll, and the Exposer is gone in
// milliseconds. When the connection cannot be made, this still returns, as slowly as before.
void StopExposer(std::unique_ptr<prometheus::Exposer> exposer, const std::string& host);

}  // namespace probesidecar::server
