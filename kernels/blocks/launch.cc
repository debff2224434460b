// Whether a kernel's code on the current device can be a programmatic dependent (launch.cuh).
#include "kernels/blocks/launch.h"

#include <mutex>
#include <vector>

namespace probesidecar::kernels::blocks {
namespace {

struct Known {
  const void* kernel;
  int device;
  bool usable;
};

}  // namespace

bool ProgrammaticLaunchUsable(const void* kernel) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  // A kernel's code per device does not change in a process: asked once per (kernel, device).
  static std::mutex mu;
  static std::vector<Known> known;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (const Known& k : known) {
      if (k.kernel == kernel && k.device == device) return k.usable;
    }
  }
  cudaFuncAttributes attr{};
  // On failure the launch itself reports (and nothing is remembered).
  if (cudaFuncGetAttributes(&attr, kernel) != cudaSuccess) return false;
  // ptxVersion: the virtual architecture the kernel's code was compiled from (x10): the grid
  // dependency instructions are in it from 90 on.
  const bool usable = attr.ptxVersion >= 90;
  std::lock_guard<std::mutex> lock(mu);
  known.push_back({kernel, device, usable});
  return usable;
}

}  // namespace probesidecar::kernels::blocks
