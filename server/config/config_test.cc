#include "server/config/config.h"

#include <vector>

#include "gtest/gtest.h"

namespace probesidecar::server {
namespace {

absl::StatusOr<ParsedFlags> Parse(std::vector<const char*> args) {
  args.insert(args.begin(), "probe-sidecar");
  return ParseFlags(static_cast<int>(args.size()), args.data());
}

TEST(ConfigTest, DefaultsListenOnUnixSocketAndLoopback) {
  absl::StatusOr<ParsedFlags> parsed = Parse({});
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->config.listen,
            (std::vector<std::string>{"unix:/tmp/probe-sidecar.sock", "127.0.0.1:50551"}));
  EXPECT_EQ(parsed->config.metrics_listen, "127.0.0.1:9464");
  EXPECT_EQ(parsed->config.backend, Backend::kAuto);
  EXPECT_FALSE(parsed->show_help);
}

TEST(ConfigTest, ListenRepeatsAndReplacesTheDefaults) {
  absl::StatusOr<ParsedFlags> parsed =
      Parse({"--listen=unix:/run/a.sock", "--listen", "0.0.0.0:7000", "--listen=[::1]:0"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->config.listen,
            (std::vector<std::string>{"unix:/run/a.sock", "0.0.0.0:7000", "[::1]:0"}));
}

TEST(ConfigTest, ValuesAndSizeSuffixes) {
  absl::StatusOr<ParsedFlags> parsed =
      Parse({"--backend=cuda", "--device", "3", "--max-message-bytes=16Mi", "--max-rows=100",
             "--max-probe-file-bytes=2Gi", "--warmup-rows=1,8,4096", "--cuda-workers=2",
             "--shutdown-grace-seconds=0.5", "--metrics-listen=none", "--probes=/p"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const Config& c = parsed->config;
  EXPECT_EQ(c.backend, Backend::kCuda);
  EXPECT_EQ(c.device, 3);
  EXPECT_EQ(c.max_message_bytes, uint64_t{16} << 20);
  EXPECT_EQ(c.max_rows, 100u);
  EXPECT_EQ(c.max_probe_file_bytes, uint64_t{2} << 30);
  EXPECT_EQ(c.warmup_rows, (std::vector<uint32_t>{1, 8, 4096}));
  EXPECT_EQ(c.cuda_workers, 2u);
  EXPECT_DOUBLE_EQ(c.shutdown_grace_seconds, 0.5);
  EXPECT_EQ(c.metrics_listen, "none");
  EXPECT_EQ(c.probes_dir, "/p");
  EXPECT_TRUE(Parse({"--warmup-rows=none"})->config.warmup_rows.empty());
}

TEST(ConfigTest, HelpAndVersion) {
  EXPECT_TRUE(Parse({"--help"})->show_help);
  EXPECT_TRUE(Parse({"--version"})->show_version);
  EXPECT_FALSE(Parse({"--help=1"}).ok());
  const std::string help = HelpText();
  for (const char* flag :
       {"--listen", "--metrics-listen", "--probes", "--backend", "--device", "--max-message-bytes",
        "--max-concurrent-requests", "--max-rows", "--max-probes", "--max-probe-file-bytes",
        "--cpu-threads", "--cuda-workers", "--graph-cache-entries", "--warmup-rows",
        "--shutdown-grace-seconds", "--log-level"}) {
    EXPECT_NE(help.find(flag), std::string::npos) << flag;
  }
}

TEST(ConfigTest, BadFlagsNameTheFlag) {
  struct Case {
    std::vector<const char*> args;
    const char* fragment;
  };
  for (const Case& c : std::vector<Case>{
           {{"--nope"}, "unknown flag --nope"},
           {{"stray"}, "unexpected argument 'stray'"},
           {{"--device"}, "--device needs a value"},
           {{"--device=-1"}, "--device=-1"},
           {{"--device=abc"}, "--device=abc"},
           {{"--backend=tpu"}, "expected auto, cpu or cuda"},
           {{"--listen=localhost"}, "expected host:port"},
           {{"--listen=host:70000"}, "expected host:port"},
           {{"--listen=unix:rel"}, "unix:/absolute/path"},
           {{"--metrics-listen=unix:/x"}, "TCP only"},
           {{"--max-message-bytes=1"}, "expected a size in"},
           {{"--max-message-bytes=99999999999999999999Gi"}, "--max-message-bytes"},
           {{"--max-rows=0"}, "--max-rows=0"},
           {{"--warmup-rows=1,x"}, "--warmup-rows=x"},
           {{"--shutdown-grace-seconds=nan"}, "expected seconds"},
           {{"--log-level=loud"}, "expected debug"},
       }) {
    absl::StatusOr<ParsedFlags> parsed = Parse(c.args);
    ASSERT_FALSE(parsed.ok()) << c.args[0];
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find(c.fragment), absl::string_view::npos)
        << parsed.status().message() << " vs " << c.fragment;
  }
  std::string long_path = "--listen=unix:/" + std::string(200, 'a');
  EXPECT_FALSE(Parse({long_path.c_str()}).ok());
}

}  // namespace
}  // namespace probesidecar::server
