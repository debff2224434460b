// probe-client: a command-line client for probe-sidecar.
//
//   probe-client [--target ADDR] [--timeout S] [--tls-ca F [--tls-cert F --tls-key F]]
//                [--admin-token-file F] COMMAND [ARGS]
//
// Commands: health [SERVICE] | info | list | load NAME (--path P | --file F) [--replace]
//           [--precision default|exact|fast] [--outcomes default|on|off] |
//           unload NAME | score --probe-set NAME (--file F [--tensor T] | --random T,H
//           [--dtype bf16|fp16|fp32] [--seed N]) [--rows I,J,...] [--json] |
//           watch [--probe-set NAME] [--interval S] [--count N] [--top N] [--by-labels]
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/cpp/client.h"
#include "client/cpp/probe_client_watch.h"
#include "common/dtype.h"
#include "common/safetensors.h"

namespace probesidecar::client {
namespace {

constexpr char kUsage[] =
    "usage: probe-client [OPTIONS] COMMAND [ARGS]\n"
    "\n"
    "  --target ADDR            unix:/path or host:port (default unix:/tmp/probe-sidecar.sock)\n"
    "  --timeout SECONDS        per call (default 30)\n"
    "  --tls-ca FILE            TLS to a TCP target: PEM CA certificates that signed the server's\n"
    "  --tls-cert FILE          with --tls-key: this client's certificate (mutual TLS)\n"
    "  --tls-key FILE\n"
    "  --admin-token-file FILE  sent with load and unload (a server with --admin-token-file)\n"
    "\n"
    "commands:\n"
    "  health [SERVICE]                     grpc.health.v1 Check\n"
    "  info                                 ServerInfo\n"
    "  list                                 loaded probe sets\n"
    "  load NAME --path P [--replace]       load a probe set from a path on the server\n"
    "  load NAME --file F [--replace]       upload a local safetensors probe set\n"
    "      [--precision default|exact|fast] exact: the file's float32 weights; fast: rounded\n"
    "                                       to the activations' 16-bit type; default: exact\n"
    "                                       up to 2 probes, fast above\n"
    "      [--outcomes default|on|off]      count what its probes find (default: the\n"
    "                                       server's --probe-outcomes)\n"
    "  unload NAME\n"
    "  score --probe-set NAME SOURCE [--rows I,J,...] [--json]\n"
    "      SOURCE: --file F.safetensors [--tensor NAME]   a 2-D activation tensor (default\n"
    "                                                    the file's only tensor)\n"
    "              --random T,H [--dtype bf16|fp16|fp32] [--seed N]\n"
    "      rows default to every row of the activations\n"
    "  watch [--probe-set NAME] [--interval S] [--count N] [--top N] [--by-labels]\n"
    "                                       a live table of what the probes found: per probe\n"
    "                                       fired/s, fire rate over the last interval and in\n"
    "                                       all, non-finite scores, p50/p90 of the scores;\n"
    "                                       every S seconds (default 1), N times (default:\n"
    "                                       until Ctrl-C); --top N: the N highest fire rates\n"
    "                                       per set; --by-labels: per set of session labels\n";

struct Args {
  std::vector<std::string> positional;
  std::map<std::string, std::string> options;  // --name value / --name=value
  std::map<std::string, bool> switches;
};

// Switches take no value; everything else starting with -- takes one.
Args ParseArgs(int argc, char** argv, int first) {
  static const char* kSwitches[] = {"replace", "json", "help", "by-labels"};
  Args args;
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0) {
      args.positional.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2);
    std::string value;
    const size_t eq = name.find('=');
    bool has_value = eq != std::string::npos;
    if (has_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    bool is_switch = false;
    for (const char* s : kSwitches) is_switch |= name == s;
    if (is_switch) {
      args.switches[name] = true;
    } else {
      if (!has_value && i + 1 < argc) value = argv[++i];
      args.options[name] = value;
    }
  }
  return args;
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "probe-client: %s\n", status.ToString().c_str());
  return 1;
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "probe-client: %s\n%s", message.c_str(), kUsage);
  return 2;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

// splitmix64: the same numbers on every platform.
uint64_t NextRandom(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

absl::StatusOr<v1::TensorRef> RandomActivations(const std::string& spec, const std::string& dtype,
                                                uint64_t seed) {
  std::vector<std::string> parts = absl::StrSplit(spec, ',');
  int64_t rows = 0, cols = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &rows) ||
      !absl::SimpleAtoi(parts[1], &cols) || rows <= 0 || cols <= 0 || rows * cols > (1 << 28)) {
    return absl::InvalidArgumentError("--random wants T,H (positive, T*H <= 2^28)");
  }
  v1::DType proto_dtype;
  int size = 2;
  if (dtype == "bf16") {
    proto_dtype = v1::DTYPE_BFLOAT16;
  } else if (dtype == "fp16") {
    proto_dtype = v1::DTYPE_FLOAT16;
  } else if (dtype == "fp32") {
    proto_dtype = v1::DTYPE_FLOAT32;
    size = 4;
  } else {
    return absl::InvalidArgumentError("--dtype must be bf16, fp16 or fp32");
  }
  std::string bytes(static_cast<size_t>(rows * cols * size), '\0');
  uint64_t state = seed;
  for (int64_t i = 0; i < rows * cols; ++i) {
    // Uniform in [-2, 2): the scale of post-norm hidden states.
    const float v = static_cast<float>(NextRandom(state) >> 40) / (1 << 24) * 4.0f - 2.0f;
    if (size == 4) {
      std::memcpy(&bytes[i * 4], &v, 4);
    } else {
      const uint16_t h = dtype == "bf16" ? common::FloatToBf16(v) : common::FloatToHalf(v);
      std::memcpy(&bytes[i * 2], &h, 2);
    }
  }
  return InlineTensor(proto_dtype, rows, cols, std::move(bytes));
}

absl::StatusOr<v1::TensorRef> FileActivations(const std::string& path, const std::string& tensor) {
  absl::StatusOr<common::SafetensorsFile> file =
      common::SafetensorsFile::Read(path, common::SafetensorsLimits{});
  if (!file.ok()) return file.status();
  const common::SafetensorsTensor* t = nullptr;
  if (!tensor.empty()) {
    t = file->Find(tensor);
    if (t == nullptr)
      return absl::NotFoundError(absl::StrCat("no tensor '", tensor, "' in ", path));
  } else if (file->tensors().size() == 1) {
    t = &file->tensors()[0];
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " holds several tensors; pick one with --tensor"));
  }
  v1::DType dtype;
  if (t->dtype == "BF16") {
    dtype = v1::DTYPE_BFLOAT16;
  } else if (t->dtype == "F16") {
    dtype = v1::DTYPE_FLOAT16;
  } else if (t->dtype == "F32") {
    dtype = v1::DTYPE_FLOAT32;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", t->name, "' is ", t->dtype,
                                                   "; activations must be BF16, F16 or F32"));
  }
  if (t->shape.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", t->name, "' is not 2-D"));
  }
  absl::Span<const uint8_t> data = file->Data(*t);
  return InlineTensor(dtype, t->shape[0], t->shape[1],
                      std::string(reinterpret_cast<const char*>(data.data()), data.size()));
}

int Score(Client& client, const Args& args) {
  auto option = [&](const std::string& name) {
    auto it = args.options.find(name);
    return it == args.options.end() ? std::string() : it->second;
  };
  const std::string probe_set = option("probe-set");
  if (probe_set.empty()) return Fail("score needs --probe-set NAME");
  absl::StatusOr<v1::TensorRef> activations;
  if (!option("file").empty()) {
    activations = FileActivations(option("file"), option("tensor"));
  } else if (!option("random").empty()) {
    uint64_t seed = 1;
    if (!option("seed").empty() && !absl::SimpleAtoi(option("seed"), &seed)) {
      return Fail("--seed wants an integer");
    }
    activations = RandomActivations(option("random"),
                                    option("dtype").empty() ? "bf16" : option("dtype"), seed);
  } else {
    return Fail("score needs --file F or --random T,H");
  }
  if (!activations.ok()) return Fail(activations.status());

  std::vector<int32_t> rows;
  if (!option("rows").empty()) {
    for (absl::string_view part : absl::StrSplit(option("rows"), ',')) {
      int32_t row = 0;
      if (!absl::SimpleAtoi(part, &row)) return Fail("--rows wants integers like 0,5,7");
      rows.push_back(row);
    }
  } else {
    for (int32_t r = 0; r < activations->shape(0); ++r) rows.push_back(r);
  }

  absl::StatusOr<ScoreResult> result = client.Score(*activations, rows, probe_set);
  if (!result.ok()) return Fail(result.status());

  // Probe names for the header.
  std::vector<std::string> names;
  if (absl::StatusOr<std::vector<v1::ProbeSetInfo>> sets = client.ListProbeSets(); sets.ok()) {
    for (const v1::ProbeSetInfo& info : *sets) {
      if (info.name() != probe_set) continue;
      for (const v1::Probe& probe : info.probes()) names.push_back(probe.name());
    }
  }
  if (static_cast<int32_t>(names.size()) != result->num_probes) {
    names.clear();
    for (int32_t p = 0; p < result->num_probes; ++p) names.push_back(absl::StrCat("probe_", p));
  }
  std::vector<bool> fired(result->scores.size(), false);
  for (int32_t index : result->fired) fired[index] = true;

  if (args.switches.count("json")) {
    std::string out =
        absl::StrCat("{\"probe_set\": \"", probe_set, "\", \"kernel_path\": \"",
                     result->kernel_path, "\", \"precision\": \"", result->precision,
                     "\", \"probes\": [\"", absl::StrJoin(names, "\", \""), "\"], \"rows\": [");
    for (int32_t r = 0; r < result->num_rows; ++r) {
      absl::StrAppend(&out, r ? ", " : "", "{\"row\": ", rows[r], ", \"scores\": [");
      for (int32_t p = 0; p < result->num_probes; ++p) {
        // JSON has no NaN or Infinity: a score that is not finite is null.
        const float score = result->scores[static_cast<size_t>(r) * result->num_probes + p];
        if (std::isfinite(score)) {
          absl::StrAppendFormat(&out, "%s%.9g", p ? ", " : "", score);
        } else {
          absl::StrAppend(&out, p ? ", " : "", "null");
        }
      }
      absl::StrAppend(&out, "]}");
    }
    absl::StrAppend(&out, "], \"fired\": [", absl::StrJoin(result->fired, ", "),
                    "], \"non_finite\": ", result->non_finite, "}\n");
    std::fputs(out.c_str(), stdout);
    return 0;
  }
  std::printf(
      "probe set %s: %d rows x %d probes (kernel path %s, precision %s; * = at or above "
      "threshold)\n",
      probe_set.c_str(), result->num_rows, result->num_probes, result->kernel_path.c_str(),
      result->precision.c_str());
  std::printf("%8s", "row");
  for (const std::string& name : names) std::printf(" %14s", name.c_str());
  std::printf("\n");
  for (int32_t r = 0; r < result->num_rows; ++r) {
    std::printf("%8d", rows[r]);
    for (int32_t p = 0; p < result->num_probes; ++p) {
      const size_t i = static_cast<size_t>(r) * result->num_probes + p;
      std::printf(" %13.6g%s", result->scores[i], fired[i] ? "*" : " ");
    }
    std::printf("\n");
  }
  if (result->non_finite > 0) {
    std::printf("%d scores are not finite (NaN or infinite activations?); they never fire\n",
                result->non_finite);
  }
  return 0;
}

int Run(int argc, char** argv) {
  // Options before the command, "--name value" or "--name=value".
  std::map<std::string, std::string> global = {{"target", "unix:/tmp/probe-sidecar.sock"}};
  static const char* kGlobal[] = {"target",   "timeout", "tls-ca",
                                  "tls-cert", "tls-key", "admin-token-file"};
  int i = 1;
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    bool matched = false;
    for (const char* name : kGlobal) {
      const std::string flag = absl::StrCat("--", name);
      if (arg == flag && i + 1 < argc) {
        global[name] = argv[++i];
      } else if (arg.rfind(flag + "=", 0) == 0) {
        global[name] = arg.substr(flag.size() + 1);
      } else {
        continue;
      }
      matched = true;
      break;
    }
    if (!matched) break;
  }
  if (i >= argc) return Fail("no command");
  const std::string target = global["target"];
  ClientOptions options;
  if (global.count("timeout") && !absl::SimpleAtod(global["timeout"], &options.timeout_seconds)) {
    return Fail("--timeout wants seconds");
  }
  if (global.count("tls-ca")) {
    grpc::SslCredentialsOptions ssl;
    for (const auto& [flag, field] :
         {std::pair{"tls-ca", &ssl.pem_root_certs}, std::pair{"tls-cert", &ssl.pem_cert_chain},
          std::pair{"tls-key", &ssl.pem_private_key}}) {
      if (!global.count(flag)) continue;
      absl::StatusOr<std::string> pem = ReadFile(global[flag]);
      if (!pem.ok()) return Fail(pem.status());
      *field = *std::move(pem);
    }
    if (ssl.pem_cert_chain.empty() != ssl.pem_private_key.empty()) {
      return Fail("--tls-cert and --tls-key go together");
    }
    options.credentials = grpc::SslCredentials(ssl);
  } else if (global.count("tls-cert") || global.count("tls-key")) {
    return Fail("--tls-cert and --tls-key need --tls-ca");
  }
  if (global.count("admin-token-file")) {
    absl::StatusOr<std::string> token = ReadFile(global["admin-token-file"]);
    if (!token.ok()) return Fail(token.status());
    options.admin_token =
        std::string(absl::StripAsciiWhitespace(token->substr(0, token->find('\n'))));
  }
  const std::string command = argv[i];
  const Args args = ParseArgs(argc, argv, i + 1);
  Client client(target, options);

  if (command == "health") {
    absl::StatusOr<std::string> status =
        client.Health(args.positional.empty() ? "" : args.positional[0]);
    if (!status.ok()) return Fail(status.status());
    std::printf("%s\n", status->c_str());
    return *status == "SERVING" ? 0 : 1;
  }
  if (command == "info") {
    absl::StatusOr<v1::ServerInfoResponse> info = client.ServerInfo();
    if (!info.ok()) return Fail(info.status());
    std::printf("%s", info->DebugString().c_str());
    return 0;
  }
  if (command == "list") {
    absl::StatusOr<std::vector<v1::ProbeSetInfo>> sets = client.ListProbeSets();
    if (!sets.ok()) return Fail(sets.status());
    for (const v1::ProbeSetInfo& set : *sets) {
      std::vector<std::string> probes;
      for (const v1::Probe& p : set.probes()) {
        probes.push_back(p.has_threshold() ? absl::StrCat(p.name(), ">=", p.threshold())
                                           : p.name());
      }
      std::printf("%s: P=%d H=%d %s %s %s [%s] (%s)\n", set.name().c_str(), set.num_probes(),
                  set.hidden_size(), v1::DType_Name(set.weight_dtype()).c_str(),
                  v1::Activation_Name(set.activation()).c_str(), PrecisionName(set.precision()),
                  absl::StrJoin(probes, ", ").c_str(), set.source().c_str());
    }
    return 0;
  }
  if (command == "load") {
    if (args.positional.size() != 1) return Fail("load NAME (--path P | --file F)");
    LoadOptions options;
    options.replace = args.switches.count("replace") > 0;
    if (auto it = args.options.find("precision"); it != args.options.end()) {
      absl::StatusOr<v1::Precision> parsed = ParsePrecision(it->second);
      if (!parsed.ok()) return Fail(parsed.status());
      options.precision = *parsed;
    }
    if (auto it = args.options.find("outcomes"); it != args.options.end()) {
      absl::StatusOr<v1::OutcomeCounting> parsed = ParseOutcomeCounting(it->second);
      if (!parsed.ok()) return Fail(parsed.status());
      options.outcome_counting = *parsed;
    }
    absl::StatusOr<v1::ProbeSetInfo> info;
    if (auto it = args.options.find("path"); it != args.options.end()) {
      info = client.LoadProbeSetFromPath(args.positional[0], it->second, options);
    } else if (auto file = args.options.find("file"); file != args.options.end()) {
      absl::StatusOr<std::string> bytes = ReadFile(file->second);
      if (!bytes.ok()) return Fail(bytes.status());
      info = client.LoadProbeSetFromBytes(args.positional[0], std::move(*bytes), options);
    } else {
      return Fail("load needs --path P (on the server) or --file F (local)");
    }
    if (!info.ok()) return Fail(info.status());
    std::printf("loaded %s: P=%d H=%d %s%s\n", info->name().c_str(), info->num_probes(),
                info->hidden_size(), PrecisionName(info->precision()),
                info->outcome_counting() == v1::OUTCOME_COUNTING_OFF ? " (outcomes not counted)"
                                                                     : "");
    return 0;
  }
  if (command == "unload") {
    if (args.positional.size() != 1) return Fail("unload NAME");
    absl::Status status = client.UnloadProbeSet(args.positional[0]);
    if (!status.ok()) return Fail(status);
    std::printf("unloaded %s\n", args.positional[0].c_str());
    return 0;
  }
  if (command == "score") return Score(client, args);
  if (command == "watch") {
    WatchOptions watch;
    if (auto it = args.options.find("probe-set"); it != args.options.end()) {
      watch.probe_set = it->second;
    }
    if (auto it = args.options.find("interval");
        it != args.options.end() &&
        (!absl::SimpleAtod(it->second, &watch.interval_seconds) ||
         !(watch.interval_seconds >= 0.05 && watch.interval_seconds <= 3600))) {
      return Fail("--interval wants seconds in [0.05, 3600]");
    }
    for (auto [flag, field] : {std::pair{"count", &watch.count}, std::pair{"top", &watch.top}}) {
      if (auto it = args.options.find(flag);
          it != args.options.end() && (!absl::SimpleAtoi(it->second, field) || *field < 0)) {
        return Fail(absl::StrCat("--", flag, " wants a count"));
      }
    }
    watch.by_labels = args.switches.count("by-labels") > 0;
    watch.clear_screen = ::isatty(STDOUT_FILENO) != 0;
    return Watch(client, watch);
  }
  return Fail(absl::StrCat("unknown command '", command, "'"));
}

}  // namespace
}  // namespace probesidecar::client

int main(int argc, char** argv) { return probesidecar::client::Run(argc, argv); }
