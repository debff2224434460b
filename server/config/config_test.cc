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

TEST(ConfigTest, ProbeOutcomes) {
  EXPECT_TRUE(Parse({})->config.count_outcomes);
  EXPECT_FALSE(Parse({"--probe-outcomes=off"})->config.count_outcomes);
  EXPECT_TRUE(Parse({"--probe-outcomes", "off", "--probe-outcomes=on"})->config.count_outcomes);
  for (const char* bad : {"--probe-outcomes=", "--probe-outcomes=OFF", "--probe-outcomes=0"}) {
    absl::StatusOr<ParsedFlags> parsed = Parse({bad});
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find("expected on or off"), std::string::npos)
        << parsed.status();
  }
  EXPECT_NE(HelpText().find("--probe-outcomes=on|off"), std::string::npos);
}

TEST(ConfigTest, ProbePrecision) {
  using kernels::ProbePrecisionRequest;
  EXPECT_EQ(Parse({})->config.probe_precision, ProbePrecisionRequest::kDefault);
  EXPECT_EQ(Parse({"--probe-precision=exact"})->config.probe_precision,
            ProbePrecisionRequest::kExact);
  EXPECT_EQ(Parse({"--probe-precision", "fast"})->config.probe_precision,
            ProbePrecisionRequest::kFast);
  EXPECT_EQ(Parse({"--probe-precision=fast", "--probe-precision=default"})->config.probe_precision,
            ProbePrecisionRequest::kDefault);
  for (const char* bad : {"--probe-precision=", "--probe-precision=EXACT", "--probe-precision=bf16",
                          "--probe-precision=exact "}) {
    absl::StatusOr<ParsedFlags> parsed = Parse({bad});
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find("expected default, exact or fast"), std::string::npos)
        << parsed.status();
  }
  EXPECT_NE(HelpText().find("--probe-precision=default|exact|fast"), std::string::npos);
}

TEST(ConfigTest, AccessControlAndLimits) {
  const Config defaults = Parse({})->config;
  EXPECT_EQ(defaults.unix_socket_mode, 0660u);
  EXPECT_TRUE(defaults.tls_cert_file.empty());
  EXPECT_TRUE(defaults.admin_token_file.empty());
  EXPECT_TRUE(defaults.admin_unix_group.empty());
  EXPECT_FALSE(defaults.allow_remote_ipc);
  EXPECT_FALSE(defaults.allow_sessionless_buffers);
  EXPECT_EQ(defaults.max_session_buffer_bytes, uint64_t{1} << 40);
  EXPECT_EQ(defaults.max_probe_sets, 256u);
  EXPECT_EQ(defaults.max_probe_set_bytes, uint64_t{16} << 30);
  EXPECT_FALSE(defaults.strict_probes);

  absl::StatusOr<ParsedFlags> parsed = Parse(
      {"--unix-socket-mode=600", "--tls-cert=/c.pem", "--tls-key=/k.pem", "--tls-client-ca=/ca.pem",
       "--admin-token-file=/t", "--admin-tls-identity=ops", "--admin-unix-group=ops",
       "--allow-remote-ipc", "--allow-sessionless-buffers", "--max-session-buffer-bytes=4Gi",
       "--max-probe-sets=3", "--max-probe-set-bytes=1Mi", "--strict-probes"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const Config& c = parsed->config;
  EXPECT_EQ(c.unix_socket_mode, 0600u);
  EXPECT_EQ(c.tls_cert_file, "/c.pem");
  EXPECT_EQ(c.tls_key_file, "/k.pem");
  EXPECT_EQ(c.tls_client_ca_file, "/ca.pem");
  EXPECT_EQ(c.admin_token_file, "/t");
  EXPECT_EQ(c.admin_tls_identity, "ops");
  EXPECT_EQ(c.admin_unix_group, "ops");
  EXPECT_TRUE(c.allow_remote_ipc);
  EXPECT_TRUE(c.allow_sessionless_buffers);
  EXPECT_EQ(c.max_session_buffer_bytes, uint64_t{4} << 30);
  EXPECT_EQ(c.max_probe_sets, 3u);
  EXPECT_EQ(c.max_probe_set_bytes, uint64_t{1} << 20);
  EXPECT_TRUE(c.strict_probes);
  EXPECT_EQ(Parse({"--unix-socket-mode=0666"})->config.unix_socket_mode, 0666u);
}

TEST(ConfigTest, ProbeOutcomeLabels) {
  const Config defaults = Parse({})->config;
  EXPECT_EQ(defaults.session_labels, (std::vector<std::string>{"model", "replica"}));
  EXPECT_EQ(defaults.max_session_label_sets, 16u);
  EXPECT_EQ(defaults.max_probe_labels, 64u);
  absl::StatusOr<ParsedFlags> parsed =
      Parse({"--session-labels=model,zone", "--max-session-label-sets=2", "--max-probe-labels=0"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->config.session_labels, (std::vector<std::string>{"model", "zone"}));
  EXPECT_EQ(parsed->config.max_session_label_sets, 2u);
  EXPECT_EQ(parsed->config.max_probe_labels, 0u);
  EXPECT_TRUE(Parse({"--session-labels=none"})->config.session_labels.empty());
  for (const char* bad : {"--session-labels=probe", "--session-labels=a,a", "--session-labels=1x",
                          "--session-labels=", "--max-session-label-sets=-1"}) {
    EXPECT_EQ(Parse({bad}).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_NE(HelpText().find("(default model,replica;"), std::string::npos);
}

TEST(ConfigTest, TheQueueBoundIsItsOwnFlag) {
  EXPECT_EQ(Parse({})->config.max_queued_requests, 128u);
  absl::StatusOr<ParsedFlags> parsed =
      Parse({"--max-queued-requests=3", "--max-concurrent-requests=50"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->config.max_queued_requests, 3u);
  EXPECT_EQ(parsed->config.max_concurrent_requests, 50u);
  EXPECT_FALSE(Parse({"--max-queued-requests=0"}).ok());
}

TEST(ConfigTest, HelpAndVersion) {
  EXPECT_TRUE(Parse({"--help"})->show_help);
  EXPECT_TRUE(Parse({"--version"})->show_version);
  EXPECT_FALSE(Parse({"--help=1"}).ok());
  const std::string help = HelpText();
  for (const char* flag : {"--listen",
                           "--metrics-listen",
                           "--probes",
                           "--backend",
                           "--device",
                           "--devices",
                           "--max-message-bytes",
                           "--max-concurrent-requests",
                           "--max-queued-requests",
                           "--max-rows",
                           "--max-probes",
                           "--max-probe-file-bytes",
                           "--cpu-threads",
                           "--cuda-workers",
                           "--graph-cache-entries",
                           "--warmup-rows",
                           "--shutdown-grace-seconds",
                           "--log-level",
                           "--unix-socket-mode",
                           "--tls-cert",
                           "--tls-key",
                           "--tls-client-ca",
                           "--admin-token-file",
                           "--admin-tls-identity",
                           "--admin-unix-group",
                           "--allow-remote-ipc",
                           "--allow-sessionless-buffers",
                           "--max-session-buffer-bytes",
                           "--max-probe-sets",
                           "--max-probe-set-bytes",
                           "--strict-probes",
                           "--session-labels",
                           "--max-session-label-sets",
                           "--max-probe-labels"}) {
    EXPECT_NE(help.find(flag), std::string::npos) << flag;
  }
}

// --help names the defaults of the Config it is given (Config{} for the binary): each default is
// written once, in Config, and the help cannot drift from it.
TEST(ConfigTest, HelpShowsTheDefaultsOfConfig) {
  const std::string help = HelpText();
  for (const char* shown : {"the defaults unix:/tmp/probe-sidecar.sock and 127.0.0.1:50551.",
                            "endpoint (default 127.0.0.1:9464)",
                            "no code for (docs/gpu-support.md) (default auto)",
                            "the process sees (default 0)",
                            "sent (default 64Mi;",
                            "RESOURCE_EXHAUSTED (default 256)",
                            "at once (default 128)",
                            "Score request (default 65536)",
                            "probe set (default 65536)",
                            "file (default 1Gi)",
                            "per core (default 0)",
                            "and graphs (default 4)",
                            "per worker (default 256)",
                            "default 1). Timed",
                            "(default 1,64;",
                            "cancelled (default 10)",
                            "connect (default 0660)",
                            "registered (default 1024Gi)",
                            "at once (default 256)",
                            "GPU; default 16Gi)",
                            "default 'default')",
                            "up to 2 probes",
                            "stderr (default info)"}) {
    EXPECT_NE(help.find(shown), std::string::npos) << shown;
  }
  EXPECT_EQ(help.find('{'), std::string::npos) << "a placeholder was left in --help";

  Config other;
  other.listen = {"unix:/run/x.sock"};
  other.max_rows = 77;
  other.max_message_bytes = uint64_t{3} << 20;
  other.warmup_rows.clear();
  other.unix_socket_mode = 0600;
  other.shutdown_grace_seconds = 2.5;
  other.probe_precision = kernels::ProbePrecisionRequest::kFast;
  const std::string shown = HelpText(other);
  for (const char* expected :
       {"With no flags it listens on unix:/run/x.sock,", "Score request (default 77)",
        "sent (default 3Mi;", "(default none;", "connect (default 0600)", "cancelled (default 2.5)",
        "default 'fast')"}) {
    EXPECT_NE(shown.find(expected), std::string::npos) << expected;
  }
}

TEST(ConfigTest, DevicesAllAListOrOneDevice) {
  const Config defaults;
  EXPECT_FALSE(defaults.all_devices);
  EXPECT_EQ(defaults.devices, std::vector<int>{0});
  absl::StatusOr<ParsedFlags> all = Parse({"--devices=all"});
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_TRUE(all->config.all_devices);
  EXPECT_TRUE(all->config.devices.empty());
  absl::StatusOr<ParsedFlags> list = Parse({"--devices", "3,1,7"});
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_FALSE(list->config.all_devices);
  EXPECT_EQ(list->config.devices, (std::vector<int>{1, 3, 7}));  // ascending
  EXPECT_EQ(list->config.device, 1);
  // --device=N is --devices=N.
  absl::StatusOr<ParsedFlags> one = Parse({"--device=2"});
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->config.devices, std::vector<int>{2});
  EXPECT_EQ(one->config.device, 2);
  EXPECT_FALSE(one->config.all_devices);
  const std::string help = HelpText();
  EXPECT_NE(help.find("--devices=all|N[,N...]"), std::string::npos);
  EXPECT_NE(help.find("(default 0)"), std::string::npos);
  Config every;
  every.all_devices = true;
  EXPECT_NE(HelpText(every).find("or all the process sees (default all)"), std::string::npos);
}

TEST(ConfigTest, BadDevicesAreRefused) {
  struct Case {
    std::vector<const char*> args;
    const char* fragment;
  };
  for (const Case& c : std::vector<Case>{
           {{"--devices="}, "--devices=: expected all, or device ordinals"},
           {{"--devices=0,,1"}, "expected all, or device ordinals"},
           {{"--devices=0,1,0"}, "device 0 is listed twice"},
           {{"--devices=1024"}, "in [0, 1023]"},
           {{"--devices=-1"}, "--devices=-1"},
           {{"--devices=All"}, "--devices=All"},
           {{"--device=all"}, "--device=all: expected a device ordinal"},
           {{"--device=0,1"}, "--device=0,1"},
           {{"--device=0", "--devices=1"}, "--devices after --device"},
           {{"--devices=all", "--devices=1"}, "--devices after --devices"},
       }) {
    absl::StatusOr<ParsedFlags> parsed = Parse(c.args);
    ASSERT_FALSE(parsed.ok()) << c.fragment;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find(c.fragment), absl::string_view::npos)
        << parsed.status().message();
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
           {{"--unix-socket-mode=0888"}, "expected an octal mode"},
           {{"--unix-socket-mode=1777"}, "expected an octal mode"},
           {{"--unix-socket-mode=rw"}, "expected an octal mode"},
           {{"--tls-cert=/c.pem"}, "--tls-cert"},
           {{"--tls-key=/k.pem"}, "--tls-cert"},
           {{"--tls-client-ca=/ca.pem"}, "--tls-client-ca needs --tls-cert"},
           {{"--admin-tls-identity=ops"}, "needs mutual TLS"},
           {{"--tls-cert=/c", "--tls-key=/k", "--admin-tls-identity=ops"}, "needs mutual TLS"},
           {{"--admin-token-file="}, "--admin-token-file"},
           {{"--admin-unix-group="}, "--admin-unix-group"},
           {{"--max-probe-sets=0"}, "--max-probe-sets=0"},
           {{"--max-session-buffer-bytes=0"}, "--max-session-buffer-bytes"},
           {{"--allow-remote-ipc=yes"}, "--allow-remote-ipc"},
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
