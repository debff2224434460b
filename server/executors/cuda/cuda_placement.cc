#include "server/executors/cuda/cuda_placement.h"

#include <cuda_runtime_api.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/executors/cuda/cuda_status.h"

namespace probesidecar::server {

absl::StatusOr<std::shared_ptr<const CudaPlacement>> PlaceOnDevice(
    const ProbeSet& set, int device, int outcome_slots,
    std::shared_ptr<DeviceMemoryLedger> ledger) {
  PS_RETURN_IF_CUDA(cudaSetDevice(device));
  auto weights = std::make_unique<kernels::ProbeWeights>();
  if (cudaError_t e = kernels::CreateProbeWeights(set.weight.data(), set.bias.data(),
                                                  set.num_probes, set.hidden, set.precision,
                                                  weights.get());
      e != cudaSuccess) {
    return CudaStatus(e, absl::StrCat("uploading the weights of probe set '", set.name, "'"));
  }
  const int64_t bytes = static_cast<int64_t>(weights->storage_bytes);
  ledger->bytes() += bytes;
  absl::StatusOr<std::unique_ptr<DeviceOutcomeCounters>> made =
      DeviceOutcomeCounters::Create(set, outcome_slots, &ledger->bytes());
  if (!made.ok()) {
    kernels::DestroyProbeWeights(weights.get());
    ledger->bytes() -= bytes;
    return absl::Status(made.status().code(),
                        absl::StrCat("probe set '", set.name, "': ", made.status().message()));
  }
  auto placed = std::make_shared<CudaPlacement>();
  // Each freed by a worker of the executor, once the set is gone (cudaFree waits for the device).
  placed->outcomes = std::shared_ptr<DeviceOutcomeCounters>(
      made->release(), [device, ledger](DeviceOutcomeCounters* counters) {
        ledger->Free([device, counters] {
          cudaSetDevice(device);
          delete counters;
        });
      });
  placed->weights = std::shared_ptr<const kernels::ProbeWeights>(
      weights.release(), [device, bytes, ledger](const kernels::ProbeWeights* p) {
        ledger->Free([device, bytes, p, ledger] {
          cudaSetDevice(device);
          auto* w = const_cast<kernels::ProbeWeights*>(p);
          kernels::DestroyProbeWeights(w);
          delete w;
          ledger->bytes() -= bytes;
        });
      });
  return std::shared_ptr<const CudaPlacement>(std::move(placed));
}

}  // namespace probesidecar::server
