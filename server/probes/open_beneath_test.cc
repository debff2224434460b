#include "server/probes/open_beneath.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace probesidecar::server {
namespace {

namespace fs = std::filesystem;
using ::absl::StatusCode;

class OpenBeneathTest : public ::testing::TestWithParam<BeneathMode> {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "/open_beneath_XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    root_ = fs::canonical(pattern);
    dir_ = root_ / "dir";
    fs::create_directories(dir_ / "sub");
    fs::create_directories(root_ / "outside");
    Write(dir_ / "a", "inside a");
    Write(dir_ / "sub" / "b", "inside b");
    Write(root_ / "outside" / "secret", "outside");
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  static void Write(const fs::path& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary) << bytes;
  }
  static std::string ReadAll(int fd) {
    std::string out(64, '\0');
    const ssize_t n = pread(fd, out.data(), out.size(), 0);
    out.resize(n > 0 ? static_cast<size_t>(n) : 0);
    return out;
  }
  absl::StatusOr<BeneathFile> Open(absl::string_view path) {
    return OpenBeneath(dir_.string(), path, GetParam());
  }
  bool Walk() const { return GetParam() == BeneathMode::kNoFollowWalk; }

  fs::path root_;
  fs::path dir_;
};

TEST_P(OpenBeneathTest, OpensFilesInside) {
  for (const std::string& path : std::vector<std::string>{"a", "./a", "sub/b", "sub//b",
                                                          "sub/../sub/b", (dir_ / "a").string()}) {
    absl::StatusOr<BeneathFile> file = Open(path);
    ASSERT_TRUE(file.ok()) << path << ": " << file.status();
    EXPECT_TRUE(absl::StartsWith(ReadAll(file->fd()), "inside")) << path;
    EXPECT_TRUE(absl::StartsWith(file->path(), dir_.string())) << file->path();
  }
  // The directory itself may be named through a symlink (the operator chose it).
  fs::create_directory_symlink(dir_, root_ / "dir_link");
  absl::StatusOr<BeneathFile> via_link =
      OpenBeneath((root_ / "dir_link").string() + "/", "sub/b", GetParam());
  ASSERT_TRUE(via_link.ok()) << via_link.status();
  EXPECT_EQ(via_link->path(), (dir_ / "sub" / "b").string());
}

TEST_P(OpenBeneathTest, RelativeSymlinksInsideFollowedOnlyWithOpenat2) {
  fs::create_symlink("sub/b", dir_ / "link");
  absl::StatusOr<BeneathFile> file = Open("link");
  if (Walk()) {
    ASSERT_EQ(file.status().code(), StatusCode::kPermissionDenied) << file.status();
    EXPECT_TRUE(absl::StrContains(file.status().message(), "symlinks are not followed"));
  } else {
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_EQ(ReadAll(file->fd()), "inside b");
    EXPECT_EQ(file->path(), (dir_ / "sub" / "b").string());  // what was opened
  }
}

TEST_P(OpenBeneathTest, NothingOutsideIsReached) {
  fs::create_symlink(root_ / "outside" / "secret", dir_ / "abs_link");
  fs::create_symlink("../outside/secret", dir_ / "rel_link");
  fs::create_directory_symlink("../outside", dir_ / "dir_link");
  fs::create_symlink("/proc/self/root/etc/passwd", dir_ / "magic");
  for (const std::string& path : std::vector<std::string>{
           "../outside/secret", "sub/../../outside/secret", "missing/../../outside/secret",
           (root_ / "outside" / "secret").string(), "/etc/passwd", "/", "..", "abs_link",
           "rel_link", "dir_link/secret", "magic"}) {
    absl::StatusOr<BeneathFile> file = Open(path);
    ASSERT_FALSE(file.ok()) << path << " was opened: " << file->path();
    EXPECT_EQ(file.status().code(), StatusCode::kPermissionDenied) << path << ": " << file.status();
  }
}

TEST_P(OpenBeneathTest, OtherErrors) {
  EXPECT_EQ(Open("").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Open(std::string("a\0b", 3)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Open("missing").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(Open("sub/missing/deeper").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(Open("a/not_a_dir").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(OpenBeneath((root_ / "nope").string(), "a", GetParam()).status().code(),
            StatusCode::kFailedPrecondition);
  // A FIFO opens at once (no writer needed); the reader refuses it as not a regular file.
  ASSERT_EQ(mkfifo((dir_ / "fifo").c_str(), 0600), 0) << std::strerror(errno);
  absl::StatusOr<BeneathFile> fifo = Open("fifo");
  ASSERT_TRUE(fifo.ok()) << fifo.status();
  struct stat st;
  ASSERT_EQ(fstat(fifo->fd(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  // Messages quote the path (control characters escaped).
  absl::Status status = Open("x\n\x1b[2J").status();
  EXPECT_TRUE(absl::StrContains(status.message(), "\"x\\x0a\\x1b[2J\"")) << status;
}

// A writer swaps `swap` between a hard link to an inside file and a symlink to the outside as fast
// as it can; every open gets the inside file or a refusal, never the outside file.
TEST_P(OpenBeneathTest, SymlinkSwapRace) {
  std::atomic<bool> stop{false};
  std::thread swapper([&] {
    const fs::path target = dir_ / "swap";
    const fs::path staged = dir_ / "staged";
    const std::string outside = (root_ / "outside" / "secret").string();
    while (!stop.load(std::memory_order_relaxed)) {
      unlink(staged.c_str());
      if (symlink(outside.c_str(), staged.c_str()) == 0) rename(staged.c_str(), target.c_str());
      unlink(staged.c_str());
      if (link((dir_ / "a").c_str(), staged.c_str()) == 0) rename(staged.c_str(), target.c_str());
    }
  });
  int opened = 0, refused = 0, leaked = 0;
  for (int i = 0; i < 20000; ++i) {
    absl::StatusOr<BeneathFile> file = Open("swap");
    if (!file.ok()) {
      ++refused;
      continue;
    }
    ++opened;
    if (ReadAll(file->fd()) != "inside a") ++leaked;
  }
  stop = true;
  swapper.join();
  EXPECT_EQ(leaked, 0) << opened << " opened, " << refused << " refused";
  EXPECT_GT(opened, 0);
  EXPECT_GT(refused, 0);
}

INSTANTIATE_TEST_SUITE_P(Modes, OpenBeneathTest,
                         ::testing::Values(BeneathMode::kAuto, BeneathMode::kNoFollowWalk),
                         [](const ::testing::TestParamInfo<BeneathMode>& info) {
                           return info.param == BeneathMode::kAuto ? "Openat2" : "NoFollowWalk";
                         });

}  // namespace
}  // namespace probesidecar::server
