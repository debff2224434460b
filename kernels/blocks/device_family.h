// The limits of the GPU families the build targets (docs/gpu-support.md), as the planners see a
// device: compute capability, shared memory, threads and registers per SM. Plain C++: the CPU
// tests plan for every family from this table, and a test or benchmark on one GPU can confine
// the planners to another family's limits (ClampToFamily) to run that family's tile choices.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string_view>

namespace probesidecar::kernels {

// What the planners read about a device (cudaDeviceGetAttribute, once per workspace).
struct DeviceLimits {
  int32_t cc_major = 0, cc_minor = 0;  // compute capability
  int32_t num_sms = 0;
  int64_t smem_per_sm = 0;              // bytes (cudaDevAttrMaxSharedMemoryPerMultiprocessor)
  int64_t smem_per_block_optin = 0;     // bytes a block may ask for (…PerBlockOptin)
  int64_t reserved_smem_per_block = 0;  // bytes the system takes per resident block
  int32_t max_threads_per_sm = 2048;
  int32_t regs_per_sm = 65536;  // 32-bit registers
};

struct DeviceFamily {
  const char* name;  // "sm_80", ...: the -DCMAKE_CUDA_ARCHITECTURES entry that covers it
  const char* gpus;  // examples
  DeviceLimits limits;
  bool sm90a;  // the sm_90a kernels (wgmma, TMA) run here: compute capability 9.0 only
};

// The data-centre and workstation families, with the limits NVIDIA's CUDA C++ Programming Guide
// lists per compute capability (SM counts of one example GPU: the planners take the real count).
inline constexpr DeviceFamily kDeviceFamilies[] = {
    {"sm_80", "A100, A30", {8, 0, 108, 167936, 166912, 1024, 2048, 65536}, false},
    {"sm_86",
     "A10, A40, RTX A6000, RTX 30-series",
     {8, 6, 84, 102400, 101376, 1024, 1536, 65536},
     false},
    {"sm_89",
     "L4, L40S, RTX 40-series, RTX 6000 Ada",
     {8, 9, 142, 102400, 101376, 1024, 1536, 65536},
     false},
    {"sm_90", "H100, H200, GH200", {9, 0, 132, 233472, 232448, 1024, 2048, 65536}, true},
    {"sm_100",
     "B200, GB200 (sm_103: B300)",
     {10, 0, 148, 233472, 232448, 1024, 2048, 65536},
     false},
    {"sm_120",
     "RTX 50-series, RTX PRO 6000 Blackwell",
     {12, 0, 188, 102400, 101376, 1024, 1536, 65536},
     false},
};
inline constexpr int kNumDeviceFamilies = sizeof(kDeviceFamilies) / sizeof(kDeviceFamilies[0]);

// The family named `name` ("sm_86"), or nullptr.
inline const DeviceFamily* FindDeviceFamily(std::string_view name) {
  for (const DeviceFamily& f : kDeviceFamilies) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

// `real` as the planners would see a device of `family`: its compute capability, the smaller of
// each shared-memory and thread limit, the real SM count (grids are sized for the GPU in hand).
// The kernels then chosen run on the real device: a test of another family's tile choices.
inline DeviceLimits ClampToFamily(const DeviceLimits& real, const DeviceFamily& family) {
  DeviceLimits l = real;
  const DeviceLimits& f = family.limits;
  l.cc_major = f.cc_major;
  l.cc_minor = f.cc_minor;
  l.smem_per_sm = std::min(real.smem_per_sm, f.smem_per_sm);
  l.smem_per_block_optin = std::min(real.smem_per_block_optin, f.smem_per_block_optin);
  l.reserved_smem_per_block = std::max(real.reserved_smem_per_block, f.reserved_smem_per_block);
  l.max_threads_per_sm = std::min(real.max_threads_per_sm, f.max_threads_per_sm);
  l.regs_per_sm = std::min(real.regs_per_sm, f.regs_per_sm);
  return l;
}

}  // namespace probesidecar::kernels
