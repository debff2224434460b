#include "server/probes/open_beneath.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/safetensors.h"

namespace probesidecar::server {
namespace {

namespace fs = std::filesystem;

// O_NONBLOCK: opening a FIFO must not wait for a writer (the reader refuses what is not regular).
constexpr int kFileFlags = O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK;

// Set once openat2 answered ENOSYS (old kernel, or a seccomp profile that does not know it).
std::atomic<bool> no_openat2{false};

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  void Reset(int fd) {
    if (fd_ >= 0) close(fd_);
    fd_ = fd;
  }
  int get() const { return fd_; }
  int Release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

std::string Quote(absl::string_view path) { return common::QuoteForMessage(path); }

absl::Status Outside(absl::string_view path) {
  return absl::PermissionDeniedError(
      absl::StrCat("path ", Quote(path), " is outside the probes directory"));
}

absl::Status OpenError(int error, absl::string_view path) {
  const std::string message =
      absl::StrCat("path ", Quote(path), ": cannot open: ", strerror(error));
  switch (error) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EXDEV:  // openat2: the path, or a symlink on it, leaves the directory
      return Outside(path);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case ELOOP:
    case ENAMETOOLONG:
      return absl::InvalidArgumentError(message);
    default:
      return absl::UnknownError(message);
  }
}

// What the kernel calls an open descriptor, "" when /proc is not there.
std::string DescriptorPath(int fd) {
  char buffer[4096];
  const std::string link = absl::StrCat("/proc/self/fd/", fd);
  const ssize_t n = readlink(link.c_str(), buffer, sizeof(buffer));
  if (n <= 0 || static_cast<size_t>(n) >= sizeof(buffer)) return "";
  return std::string(buffer, static_cast<size_t>(n));
}

bool IsWithin(const fs::path& path, const fs::path& dir) {
  auto p = path.begin();
  for (const fs::path& part : dir) {
    if (p == path.end() || *p != part) return false;
    ++p;
  }
  return true;
}

// `path` relative to `dir`, normalised lexically; refused when it says it leaves `dir`.
absl::StatusOr<fs::path> RelativeInside(const std::string& dir, int dir_fd,
                                        absl::string_view path) {
  const fs::path requested{std::string(path)};
  fs::path relative;
  if (requested.is_absolute()) {
    const fs::path normal = requested.lexically_normal();
    // The directory as given (made absolute) or as the kernel resolved it.
    fs::path given = fs::absolute(fs::path(dir)).lexically_normal();
    if (!given.has_filename()) given = given.parent_path();
    for (const fs::path& root : {given, fs::path(DescriptorPath(dir_fd))}) {
      if (root.empty() || !IsWithin(normal, root)) continue;
      relative = normal.lexically_relative(root);
      break;
    }
    if (relative.empty()) return Outside(path);
  } else {
    relative = requested.lexically_normal();
  }
  if (relative.empty() || *relative.begin() == "..") return Outside(path);
  return relative;
}

// Returns a descriptor, or -errno.
int OpenWithOpenat2(int dir_fd, const fs::path& relative) {
  struct open_how how = {};
  how.flags = kFileFlags;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  for (int attempt = 0;; ++attempt) {
    const long fd = syscall(SYS_openat2, dir_fd, relative.c_str(), &how, sizeof(how));
    if (fd >= 0) return static_cast<int>(fd);
    // EAGAIN: a rename elsewhere raced the lookup; the kernel asks for a retry.
    if (errno == EINTR || (errno == EAGAIN && attempt < 64)) continue;
    return -errno;
  }
}

absl::StatusOr<int> OpenWithoutSymlinks(int dir_fd, const fs::path& relative,
                                        absl::string_view path) {
  std::vector<std::string> parts;
  for (const fs::path& part : relative) {
    if (!part.empty() && part != ".") parts.push_back(part.string());
  }
  if (parts.empty()) parts.push_back(".");
  auto symlink_refusal = [path](int at, const std::string& name) -> absl::Status {
    struct stat st;
    if (fstatat(at, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)) {
      return absl::PermissionDeniedError(absl::StrCat(
          "path ", Quote(path), ": ", Quote(name),
          " is a symlink, and symlinks are not followed here (this kernel has no openat2)"));
    }
    return absl::OkStatus();
  };
  Fd current(fcntl(dir_fd, F_DUPFD_CLOEXEC, 0));
  if (current.get() < 0) return OpenError(errno, path);
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    const int next =
        openat(current.get(), parts[i].c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0) {
      const int error = errno;
      if (absl::Status s = symlink_refusal(current.get(), parts[i]); !s.ok()) return s;
      return OpenError(error, path);
    }
    current.Reset(next);
  }
  const int fd = openat(current.get(), parts.back().c_str(), kFileFlags | O_NOFOLLOW);
  if (fd < 0) {
    const int error = errno;
    if (absl::Status s = symlink_refusal(current.get(), parts.back()); !s.ok()) return s;
    return OpenError(error, path);
  }
  return fd;
}

}  // namespace

BeneathFile::BeneathFile(BeneathFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}

BeneathFile::~BeneathFile() {
  if (fd_ >= 0) close(fd_);
}

absl::StatusOr<BeneathFile> OpenBeneath(const std::string& dir, absl::string_view path,
                                        BeneathMode mode) {
  if (path.empty()) return absl::InvalidArgumentError("empty path");
  if (path.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError("path contains a NUL byte");
  }
  Fd dir_fd(open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (dir_fd.get() < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("probes directory ", Quote(dir), " cannot be opened: ", strerror(errno)));
  }
  absl::StatusOr<fs::path> relative = RelativeInside(dir, dir_fd.get(), path);
  if (!relative.ok()) return relative.status();

  Fd file;
  if (mode == BeneathMode::kAuto && !no_openat2.load(std::memory_order_relaxed)) {
    const int fd = OpenWithOpenat2(dir_fd.get(), *relative);
    if (fd == -ENOSYS) {
      no_openat2.store(true, std::memory_order_relaxed);
    } else if (fd < 0) {
      return OpenError(-fd, path);
    } else {
      file.Reset(fd);
    }
  }
  if (file.get() < 0) {
    absl::StatusOr<int> fd = OpenWithoutSymlinks(dir_fd.get(), *relative, path);
    if (!fd.ok()) return fd.status();
    file.Reset(*fd);
  }

  // Check what was opened, not what the name meant a moment ago.
  const std::string base = DescriptorPath(dir_fd.get());
  std::string opened = DescriptorPath(file.get());
  if (!base.empty() && !opened.empty() && !IsWithin(fs::path(opened), fs::path(base))) {
    return Outside(path);
  }
  if (opened.empty()) opened = (fs::path(dir) / *relative).string();
  return BeneathFile(file.Release(), std::move(opened));
}

}  // namespace probesidecar::server
