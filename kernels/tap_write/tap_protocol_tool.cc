// The tap protocol as the C++ side has it, for tests/python/test_tap_protocol.py (CPU only): the
// layout and counters as JSON, the scenario scripts, the CPU reference's run of a script, and the
// C++ reader's check of rings another writer saved (tap_protocol_script.h has the commands).
#include <cstdio>

#include "kernels/tap_write/tap_protocol_script.h"

int main(int argc, char** argv) {
  const int status = probesidecar::kernels::tap_protocol::RunTapProtocolCommand(argc, argv);
  if (status >= 0) return status;
  std::fprintf(stderr,
               "usage: tap_protocol_tool layout CONFIG... | scenario K MB H P DTYPE 0|1 | "
               "run-ref SCRIPT DIR | read SCRIPT DIR\n");
  return 2;
}
