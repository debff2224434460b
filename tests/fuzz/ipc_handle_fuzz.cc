// Fuzz target: the IPC handle parser (RegisterBuffer's `handle` bytes).
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "server/ipc/ipc_handle.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<probesidecar::server::IpcHandleBytes> handle =
      probesidecar::server::ParseIpcHandle(input);
  if (!handle.ok()) {
    FUZZ_CHECK(handle.status().code() == absl::StatusCode::kInvalidArgument ||
               handle.status().code() == absl::StatusCode::kUnimplemented);
    return 0;
  }
  // Accepted: a raw 64-byte handle as is, or PyTorch's 66-byte version-2 'c' handle without its
  // two-byte prefix; never all zeros.
  FUZZ_CHECK(size == 64 || (size == 66 && data[0] == 2 && data[1] == 'c'));
  const uint8_t* raw = size == 64 ? data : data + 2;
  FUZZ_CHECK(std::memcmp(handle->data(), raw, 64) == 0);
  bool all_zero = true;
  for (char c : *handle) all_zero &= c == 0;
  FUZZ_CHECK(!all_zero);
  return 0;
}
