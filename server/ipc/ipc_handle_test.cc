#include "server/ipc/ipc_handle.h"

#include <string>

#include "gtest/gtest.h"

namespace probesidecar::server {
namespace {

std::string RawHandle(char fill = 'h') {
  std::string h(64, fill);
  h[0] = 1;
  return h;
}

TEST(IpcHandleTest, AcceptsRawCudaHandle) {
  absl::StatusOr<IpcHandleBytes> parsed = ParseIpcHandle(RawHandle());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(std::string(parsed->data(), 64), RawHandle());
}

TEST(IpcHandleTest, AcceptsTorchVersionedHandleAndStripsThePrefix) {
  const std::string torch = std::string(
                                "\x02"
                                "c",
                                2) +
                            RawHandle('t');
  absl::StatusOr<IpcHandleBytes> parsed = ParseIpcHandle(torch);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(std::string(parsed->data(), 64), RawHandle('t'));
}

TEST(IpcHandleTest, RefusesExpandableSegmentsWithTheFix) {
  const std::string expandable = std::string(
                                     "\x02"
                                     "e",
                                     2) +
                                 std::string(40, 'x');
  absl::StatusOr<IpcHandleBytes> parsed = ParseIpcHandle(expandable);
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(parsed.status().message().find("expandable_segments"), absl::string_view::npos);
  EXPECT_NE(parsed.status().message().find("PYTORCH_CUDA_ALLOC_CONF"), absl::string_view::npos);
}

TEST(IpcHandleTest, RefusesEverythingElseWithTheReason) {
  struct Case {
    std::string handle;
    const char* fragment;
  };
  for (const Case& c : std::vector<Case>{
           {"", "0 bytes is neither"},
           {std::string(63, 'x'), "63 bytes is neither"},
           {std::string(65, 'x'), "65 bytes is neither"},
           {std::string(66, 'x'), "66 bytes is neither"},
           {std::string("\x02"
                        "x",
                        2) +
                std::string(64, 'x'),
            "66 bytes is neither"},
           {std::string("\x03"
                        "c",
                        2) +
                std::string(64, 'x'),
            "version 3 is not supported"},
           {std::string(64, '\0'), "all zero bytes"},
           {std::string("\x02"
                        "c",
                        2) +
                std::string(64, '\0'),
            "all zero bytes"},
           {std::string(1000, 'x'), "1000 bytes"},
       }) {
    absl::StatusOr<IpcHandleBytes> parsed = ParseIpcHandle(c.handle);
    ASSERT_FALSE(parsed.ok()) << c.fragment;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << c.fragment;
    EXPECT_NE(parsed.status().message().find(c.fragment), absl::string_view::npos)
        << parsed.status().message();
  }
}

}  // namespace
}  // namespace probesidecar::server
