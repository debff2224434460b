// probe-bench's use of this machine's GPU: its name, the ceilings measured beside the RPCs, and
// activations registered with the server over CUDA IPC. Only the IPC modes need a GPU; the rest
// of probe-bench never calls into CUDA.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "client/cpp/client.h"
#include "client/cpp/session.h"

namespace probesidecar::bench {

// The name of CUDA device 0; an error when there is none (no driver, no device).
absl::StatusOr<std::string> CudaDeviceName();

struct Ceilings {
  double copy_gbps = 0;    // cudaMemcpy device to device, bytes read + written per second
  double bf16_tflops = 0;  // cuBLAS bf16 GEMM 8192^3, fp32 accumulation
};
absl::StatusOr<Ceilings> MeasureCeilings();

// bf16 [tokens, hidden] in this process's GPU memory, registered with the server under a session
// of its own; unregistered and freed on destruction.
class IpcActivations {
 public:
  static absl::StatusOr<std::unique_ptr<IpcActivations>> Create(client::Client& client,
                                                                const std::string& host_bf16,
                                                                int64_t tokens, int64_t hidden);
  ~IpcActivations();
  uint64_t buffer_id() const { return buffer_id_; }
  uint64_t session_id() const { return session_->id(); }

 private:
  IpcActivations(client::Client& client) : client_(client) {}
  client::Client& client_;
  void* device_ = nullptr;
  std::unique_ptr<client::Session> session_;
  uint64_t buffer_id_ = 0;
};

}  // namespace probesidecar::bench
