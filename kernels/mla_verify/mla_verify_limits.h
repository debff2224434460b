// The shapes MLA verify serves: FlashMLA's layout and the limits of the kernels and their
// workspaces. Plain C++, so that request validation outside kernels/ (the server) reads the same
// numbers without CUDA headers.
#pragma once

#include <cstdint>

namespace probesidecar::kernels {

inline constexpr int kMlaHeadDimQk = 576;  // latent 512 + rope 64
inline constexpr int kMlaHeadDimV = 512;
inline constexpr int kMlaPageSize = 64;  // tokens per cache page
inline constexpr int kMlaMaxSq = 16;
inline constexpr int kMlaMaxHeads = 128;
// Requests per launch: the batch a workspace is made for by default (MlaVerifyWorkspaceConfig)
// and the largest batch the server accepts.
inline constexpr int32_t kMlaMaxBatch = 256;

}  // namespace probesidecar::kernels
