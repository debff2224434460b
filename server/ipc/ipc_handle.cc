#include "server/ipc/ipc_handle.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace probesidecar::server {
namespace {

constexpr size_t kTorchHandleBytes = 2 + kIpcHandleBytes;
constexpr char kTorchHandleVersion = 2;

// The 64 bytes of `raw`, unless they are all zero (never what `maker` returns).
absl::StatusOr<IpcHandleBytes> Copy(absl::string_view raw, absl::string_view maker) {
  if (std::all_of(raw.begin(), raw.end(), [](char c) { return c == 0; })) {
    return absl::InvalidArgumentError(
        absl::StrCat("handle: all zero bytes; not a handle from ", maker));
  }
  IpcHandleBytes bytes;
  std::memcpy(bytes.data(), raw.data(), kIpcHandleBytes);
  return bytes;
}

}  // namespace

absl::StatusOr<IpcHandleBytes> ParseIpcHandle(absl::string_view handle) {
  absl::string_view raw;
  if (handle.size() == kIpcHandleBytes) {
    raw = handle;
  } else if (handle.size() >= 2 && (handle[1] == 'c' || handle[1] == 'e') &&
             handle[0] != kTorchHandleVersion) {
    return absl::InvalidArgumentError(
        absl::StrFormat("handle: PyTorch handle version %d is not supported (expected version 2)",
                        static_cast<int>(static_cast<unsigned char>(handle[0]))));
  } else if (handle.size() >= 2 && handle[0] == kTorchHandleVersion && handle[1] == 'e') {
    return absl::UnimplementedError(
        "handle: this is a PyTorch expandable-segment handle, which is not supported yet; start "
        "the inference server without expandable segments (PYTORCH_CUDA_ALLOC_CONF without "
        "expandable_segments:True) so that tensors live in cudaMalloc blocks");
  } else if (handle.size() == kTorchHandleBytes && handle[0] == kTorchHandleVersion &&
             handle[1] == 'c') {
    raw = handle.substr(2);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "handle: ", handle.size(),
        " bytes is neither a 64-byte cudaIpcMemHandle_t nor PyTorch's 66-byte storage handle "
        "(version 2, type 'c', then the 64-byte handle)"));
  }
  return Copy(raw, "cudaIpcGetMemHandle");
}

absl::StatusOr<IpcHandleBytes> ParseIpcEventHandle(absl::string_view handle) {
  if (handle.size() != kIpcHandleBytes) {
    return absl::InvalidArgumentError(absl::StrCat("handle: a cudaIpcEventHandle_t is ",
                                                   kIpcHandleBytes, " bytes, not ", handle.size()));
  }
  return Copy(handle, "cudaIpcGetEventHandle");
}

}  // namespace probesidecar::server
