#include <cstdint>

#include "tests/faults/test_faults.h"

namespace probesidecar::kernels {
namespace {

// One thread writes to an address no allocation covers (the first page of the address space is
// never mapped on the device).
__global__ void WriteOutOfBoundsKernel(int* target) { *target = 1; }

}  // namespace

cudaError_t LaunchTestIllegalAddress(cudaStream_t stream) {
  WriteOutOfBoundsKernel<<<1, 1, 0, stream>>>(reinterpret_cast<int*>(uintptr_t{64}));
  return cudaGetLastError();
}

}  // namespace probesidecar::kernels
