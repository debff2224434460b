// Opening a file inside a directory so that nothing outside it can be reached, even while another
// process renames files and swaps symlinks in that directory: the kernel resolves the path and
// the check is made on what was opened, not on a name resolved earlier.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace probesidecar::server {

enum class BeneathMode {
  // openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS), falling back to kNoFollowWalk where the
  // kernel (or a seccomp profile) lacks openat2. Relative symlinks that stay inside are followed
  // (Kubernetes ConfigMap volumes are made of them); "..", absolute paths and absolute symlinks
  // that would leave the directory are refused.
  kAuto,
  // Component by component from a directory descriptor with O_NOFOLLOW: no symlink is followed.
  kNoFollowWalk,
};

// An open, read-only descriptor (closed with the object) and the path it was opened at.
class BeneathFile {
 public:
  BeneathFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  BeneathFile(BeneathFile&& other) noexcept;
  BeneathFile& operator=(BeneathFile&&) = delete;
  BeneathFile(const BeneathFile&) = delete;
  ~BeneathFile();

  int fd() const { return fd_; }
  // The file's absolute path as the kernel names the open descriptor (symlinks resolved).
  const std::string& path() const { return path_; }

 private:
  int fd_;
  std::string path_;
};

// Opens `path` (relative to `dir`, or absolute and lexically inside it) for reading. `dir` itself
// may be reached through symlinks (the operator chose it). PERMISSION_DENIED for anything that
// would leave `dir` (before looking at the filesystem when the path says so lexically, so that
// nothing about the outside leaks); NOT_FOUND for a missing file inside; INVALID_ARGUMENT for
// empty paths, NUL bytes and symlink loops; FAILED_PRECONDITION when `dir` cannot be opened.
absl::StatusOr<BeneathFile> OpenBeneath(const std::string& dir, absl::string_view path,
                                        BeneathMode mode = BeneathMode::kAuto);

}  // namespace probesidecar::server
