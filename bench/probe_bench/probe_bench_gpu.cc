#include "bench/probe_bench/probe_bench_gpu.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/probe_bench/probe_bench_workload.h"
#include "client/cpp/cuda_buffer.h"

namespace probesidecar::bench {
namespace {

absl::Status Cuda(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(error)));
}

// Device memory freed on scope exit.
struct DeviceBuffer {
  void* ptr = nullptr;
  ~DeviceBuffer() {
    if (ptr != nullptr) cudaFree(ptr);
  }
};

// Median milliseconds of `reps` timed runs of `op` (after two untimed ones).
absl::StatusOr<double> MedianMs(int reps, const std::function<bool()>& op) {
  cudaEvent_t begin, end;
  if (absl::Status s = Cuda(cudaEventCreate(&begin), "cudaEventCreate"); !s.ok()) return s;
  if (absl::Status s = Cuda(cudaEventCreate(&end), "cudaEventCreate"); !s.ok()) {
    cudaEventDestroy(begin);
    return s;
  }
  std::vector<float> ms;
  absl::Status status;
  for (int i = 0; i < reps + 2 && status.ok(); ++i) {
    float t = 0;
    status = Cuda(cudaEventRecord(begin), "cudaEventRecord");
    if (status.ok() && !op()) status = absl::InternalError("the timed operation failed");
    if (status.ok()) status = Cuda(cudaEventRecord(end), "cudaEventRecord");
    if (status.ok()) status = Cuda(cudaEventSynchronize(end), "cudaEventSynchronize");
    if (status.ok()) status = Cuda(cudaEventElapsedTime(&t, begin, end), "cudaEventElapsedTime");
    if (i >= 2) ms.push_back(t);
  }
  cudaEventDestroy(begin);
  cudaEventDestroy(end);
  if (!status.ok()) return status;
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

absl::StatusOr<double> CopyGbps() {
  const size_t bytes = size_t{1} << 30;
  DeviceBuffer a, b;
  if (absl::Status s = Cuda(cudaMalloc(&a.ptr, bytes), "cudaMalloc"); !s.ok()) return s;
  if (absl::Status s = Cuda(cudaMalloc(&b.ptr, bytes), "cudaMalloc"); !s.ok()) return s;
  absl::StatusOr<double> ms = MedianMs(
      10, [&] { return cudaMemcpy(b.ptr, a.ptr, bytes, cudaMemcpyDeviceToDevice) == cudaSuccess; });
  if (!ms.ok()) return ms.status();
  return 2.0 * bytes / (*ms * 1e-3) / 1e9;
}

absl::StatusOr<double> GemmTflops() {
  const int n = 8192;
  const size_t matrix_bytes = size_t{2} * n * n;
  DeviceBuffer abc;
  if (absl::Status s = Cuda(cudaMalloc(&abc.ptr, 3 * matrix_bytes), "cudaMalloc"); !s.ok()) {
    return s;
  }
  // Random operands (a GEMM of constants draws less power): 8 MiB of random bf16, tiled.
  const std::string tile = RandomBf16(size_t{4} << 20, 11);
  char* base = static_cast<char*>(abc.ptr);
  for (size_t at = 0; at < 2 * matrix_bytes; at += tile.size()) {
    const size_t bytes = std::min(tile.size(), 2 * matrix_bytes - at);
    if (absl::Status s =
            Cuda(cudaMemcpy(base + at, tile.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
        !s.ok()) {
      return s;
    }
  }
  cublasHandle_t handle = nullptr;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) {
    return absl::InternalError("cublasCreate failed");
  }
  const float one = 1.0f, zero = 0.0f;
  absl::StatusOr<double> ms = MedianMs(10, [&] {
    return cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, base, CUDA_R_16BF, n,
                        base + matrix_bytes, CUDA_R_16BF, n, &zero, base + 2 * matrix_bytes,
                        CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
  });
  cublasDestroy(handle);
  if (!ms.ok()) return ms.status();
  return 2.0 * n * n * double(n) / (*ms * 1e-3) / 1e12;
}

}  // namespace

absl::StatusOr<std::string> CudaDeviceName() {
  int count = 0;
  if (absl::Status s = Cuda(cudaGetDeviceCount(&count), "cudaGetDeviceCount"); !s.ok()) return s;
  if (count == 0) return absl::NotFoundError("no CUDA device");
  cudaDeviceProp prop{};
  if (absl::Status s = Cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
      !s.ok()) {
    return s;
  }
  return std::string(prop.name);
}

absl::StatusOr<Ceilings> MeasureCeilings() {
  Ceilings c;
  absl::StatusOr<double> copy = CopyGbps();
  if (!copy.ok()) return copy.status();
  absl::StatusOr<double> gemm = GemmTflops();
  if (!gemm.ok()) return gemm.status();
  c.copy_gbps = *copy;
  c.bf16_tflops = *gemm;
  return c;
}

absl::StatusOr<std::unique_ptr<IpcActivations>> IpcActivations::Create(client::Client& client,
                                                                       const std::string& host_bf16,
                                                                       int64_t tokens,
                                                                       int64_t hidden) {
  std::unique_ptr<IpcActivations> a(new IpcActivations(client));
  const size_t bytes = static_cast<size_t>(tokens) * hidden * 2;
  if (host_bf16.size() < bytes) return absl::InternalError("IpcActivations: too few host bytes");
  if (absl::Status s = Cuda(cudaMalloc(&a->device_, bytes), "cudaMalloc"); !s.ok()) return s;
  if (absl::Status s = Cuda(cudaMemcpy(a->device_, host_bf16.data(), bytes, cudaMemcpyHostToDevice),
                            "cudaMemcpy");
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::unique_ptr<client::Session>> session = client::Session::Open(client);
  if (!session.ok()) {
    return absl::Status(session.status().code(),
                        absl::StrCat("OpenSession: ", session.status().message()));
  }
  a->session_ = *std::move(session);
  absl::StatusOr<v1::RegisterBufferResponse> reg = client::RegisterDeviceMemory(
      client, a->device_, bytes, "probe-bench activations", a->session_->id());
  if (!reg.ok()) {
    return absl::Status(reg.status().code(),
                        absl::StrCat("RegisterBuffer: ", reg.status().message()));
  }
  a->buffer_id_ = reg->buffer_id();
  return a;
}

IpcActivations::~IpcActivations() {
  if (buffer_id_ != 0) client_.UnregisterBuffer(buffer_id_, session_->id()).IgnoreError();
  session_.reset();
  if (device_ != nullptr) cudaFree(device_);
}

}  // namespace probesidecar::bench
