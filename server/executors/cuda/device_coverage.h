// What the CUDA backend tells an operator about a GPU at start-up: the message for a device this
// build holds no code for, and the kernel paths it runs on one it covers (ServerInfo). Plain C++
// (no CUDA), so the CPU tests check it.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace probesidecar::server {

// Names the device, its compute capability, the build's CUDA targets and the option to change.
inline std::string UncoveredDeviceMessage(int device, const std::string& name, int cc_major,
                                          int cc_minor, const std::string& build_targets) {
  return absl::StrCat(
      "CUDA device ", device, " (", name, ", compute capability ", cc_major, ".", cc_minor,
      ") is not covered by this build (CUDA targets: ", build_targets,
      "): rebuild with -DCMAKE_CUDA_ARCHITECTURES including ", cc_major, cc_minor,
      "-real (the default list has machine code for sm_80, sm_86/89, sm_90, sm_100 and sm_120 "
      "and PTX for newer GPUs: docs/gpu-support.md), or start with --backend cpu");
}

// The kernel paths of this build on a device: the portable ones everywhere, the sm_90a ones where
// `sm90a` (compute capability 9.0, the sm_90a kernels built, tensor maps encodable).
inline std::vector<std::string> KernelPathsFor(bool sm90a) {
  std::vector<std::string> paths = {"fused_cuda", "fused_tc", "gather_gemm"};
  if (sm90a) paths.push_back("gather_wgmma");
  paths.insert(paths.end(), {"split_kv", "baseline"});
  if (sm90a) paths.push_back("split_kv_sm90a");
  return paths;
}

}  // namespace probesidecar::server
