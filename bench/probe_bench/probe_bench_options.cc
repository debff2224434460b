#include "bench/probe_bench/probe_bench_options.h"

#include <functional>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "bench/probe_bench/probe_bench_modes.h"

namespace probesidecar::bench {
namespace {

constexpr char kHelp[] = R"(probe-bench: a load generator for probe-sidecar, beside a bare gRPC echo
(probe-echo-server, bench/rpc) of the same transport and payload size.

usage: probe-bench --target=ADDR [--echo-target=ADDR] [--modes=LIST] [LOAD] [OUTPUT]

Every flag is --name=value. Lists are comma-separated; each (rows, probes, load point, mode)
combination is one record.

Where
  --target=ADDR         probe-sidecar: unix:/path or host:port (needed by the score modes)
  --echo-target=ADDR    probe-echo-server, for the echo modes (they are skipped without it)
  --transport=uds|tcp   recorded in each record (default: uds for unix: targets, else tcp)
  --admin-token-file=F  the admin token (first line of F), sent when loading the probe sets: a
                        server run with --admin-token-file, or any server over TCP (without an
                        admin credential only its own user, over its Unix socket, may load)

What
  --modes=LIST          default echo,score_ipc,score_inline; one or more of:
{MODES}  --rows=LIST           R, rows scored per request (default 1,64,1024,8192)
  --probes=LIST         P, probes in the probe set (default 1,16); probe-bench loads random
                        bf16 probe sets bench_p<P> of width H into the server
  --hidden=H            activation width (default 4096)
  --tokens=T            rows of the activations registered over CUDA IPC (default 16384)
  --bad-fraction=F      share of score requests (evenly spread) that name a probe set that is not
                        loaded, so the server answers NOT_FOUND (default 0); echo modes ignore it

Load: closed loop
  --concurrency=LIST    client threads, each with its own connection, each sending its next
                        request when the last one is answered (default 1,16). Runs unless only
                        --rate is given.
Load: open loop
  --rate=LIST           requests/s. Requests are sent on a schedule fixed in advance, whether or
                        not earlier ones were answered, and latency is measured from each
                        request's SCHEDULED send time: a slow server (or a slow probe-bench)
                        shows as latency instead of being hidden by sending less (no coordinated
                        omission). send_lag_us in the results says how late probe-bench itself
                        sent.
  --arrivals=poisson|constant
                        gaps between scheduled sends: exponential (default) or equal
  --max-outstanding=N   at most N requests in flight (default 256); a request whose send time
                        comes while N are in flight is not sent and is counted as not_sent
  --connections=N       channels the open loop's requests are spread over (default 4)

Both
  --seconds=S           measured duration of each record (default 1.5)
  --warmup=N            untimed calls before each record: per client thread (closed loop), in
                        all (open loop) (default 100)
  --timeout=S           deadline of each unary call; a stream is cancelled S seconds (open
                        loop: S + 1) after its run's end (default 30); set-up calls (loading
                        probe sets) get 30 s at least
  --seed=N              seed of the Poisson schedule and of the random data (default 1)
  --quiet               no progress line (it goes to stderr once per second: elapsed, sent, ok,
                        errors, the last second's rate, p50/p99 so far)

Output (a summary line per record always goes to stdout)
  --out=FILE.json       results: device, git, date, command, ceilings, records
  --csv=FILE.csv        the same records, one row each
  --server-label=NAME   recorded in each record, to compare server binaries in one report
                        (e.g. before/after); default empty
  --git=HASH            the full 40-character commit measured (default: $PROBE_SIDECAR_GIT);
                        needed with --out or --csv
  --allow-dirty         accept HASH+dirty (uncommitted changes); refused otherwise
  --help                this text

Latency is per call on the client, over every call of every thread; throughput_rps counts
answered calls (any status) per second. CUDA is used only by the *_ipc modes (and to measure
the GPU ceilings when a GPU is present); the other modes run on machines without one.
)";

std::vector<std::string> Split(const std::string& text) {
  return absl::StrSplit(text, ',', absl::SkipEmpty());
}

absl::Status BadValue(const std::string& flag, const std::string& value, const char* want) {
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, "=", value, ": expected ", want, " (see --help)"));
}

absl::Status IntList(const std::string& flag, const std::string& value, int min,
                     std::vector<int>* out) {
  out->clear();
  for (const std::string& part : Split(value)) {
    int v = 0;
    if (!absl::SimpleAtoi(part, &v) || v < min) {
      return BadValue(flag, value, min > 0 ? "positive integers" : "integers");
    }
    out->push_back(v);
  }
  if (out->empty()) return BadValue(flag, value, "a list");
  return absl::OkStatus();
}

absl::Status OneInt(const std::string& flag, const std::string& value, int min, int* out) {
  std::vector<int> list;
  if (absl::Status s = IntList(flag, value, min, &list); !s.ok()) return s;
  if (list.size() != 1) return BadValue(flag, value, "one integer");
  *out = list[0];
  return absl::OkStatus();
}

absl::Status NonNegative(const std::string& flag, const std::string& value, double* out) {
  if (!absl::SimpleAtod(value, out) || !(*out >= 0)) {
    return BadValue(flag, value, "a number >= 0");
  }
  return absl::OkStatus();
}

absl::Status Validate(Options& o, bool concurrency_given) {
  for (const std::string& mode : o.modes) {
    if (FindMode(mode) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--modes: unknown mode '", mode, "'; known: ", absl::StrJoin(ModeNames(), ",")));
    }
    if (!FindMode(mode)->echo && o.target.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("mode ", mode, " needs --target"));
    }
  }
  if (o.modes.empty()) return absl::InvalidArgumentError("--modes: empty");
  if (o.seconds <= 0) return absl::InvalidArgumentError("--seconds must be > 0");
  if (o.bad_fraction > 1) return absl::InvalidArgumentError("--bad-fraction must be in [0, 1]");
  if (o.transport != "" && o.transport != "uds" && o.transport != "tcp") {
    return BadValue("transport", o.transport, "uds or tcp");
  }
  for (double rate : o.rates) {
    if (rate <= 0) return absl::InvalidArgumentError("--rate: rates must be > 0");
  }
  // Only --rate given: open loop alone.
  o.closed_loop = concurrency_given || o.rates.empty();
  return absl::OkStatus();
}

}  // namespace

const char* ArrivalsName(Arrivals arrivals) {
  return arrivals == Arrivals::kPoisson ? "poisson" : "constant";
}

std::string HelpText() {
  std::string modes;
  for (const std::string& name : ModeNames()) {
    absl::StrAppend(&modes, "                          ", name, ": ", FindMode(name)->help, "\n");
  }
  return absl::StrReplaceAll(kHelp, {{"{MODES}", modes}});
}

absl::StatusOr<Options> ParseOptions(int argc, char** argv) {
  Options o;
  bool concurrency_given = false;
  using Setter = std::function<absl::Status(const std::string&)>;
  auto text = [](std::string* field) {
    return [field](const std::string& v) {
      *field = v;
      return absl::OkStatus();
    };
  };
  const std::map<std::string, Setter> flags = {
      {"target", text(&o.target)},
      {"echo-target", text(&o.echo_target)},
      {"transport", text(&o.transport)},
      {"admin-token-file", text(&o.admin_token_file)},
      {"out", text(&o.out)},
      {"csv", text(&o.csv)},
      {"git", text(&o.git)},
      {"server-label", text(&o.server_label)},
      {"modes",
       [&](const std::string& v) {
         o.modes = Split(v);
         return absl::OkStatus();
       }},
      {"rows", [&](const std::string& v) { return IntList("rows", v, 1, &o.rows); }},
      {"probes", [&](const std::string& v) { return IntList("probes", v, 1, &o.probes); }},
      {"concurrency",
       [&](const std::string& v) {
         concurrency_given = true;
         return IntList("concurrency", v, 1, &o.concurrency);
       }},
      {"hidden", [&](const std::string& v) { return OneInt("hidden", v, 1, &o.hidden); }},
      {"tokens", [&](const std::string& v) { return OneInt("tokens", v, 1, &o.tokens); }},
      {"warmup", [&](const std::string& v) { return OneInt("warmup", v, 0, &o.warmup); }},
      {"max-outstanding",
       [&](const std::string& v) { return OneInt("max-outstanding", v, 1, &o.max_outstanding); }},
      {"connections",
       [&](const std::string& v) { return OneInt("connections", v, 1, &o.connections); }},
      {"seconds", [&](const std::string& v) { return NonNegative("seconds", v, &o.seconds); }},
      {"timeout",
       [&](const std::string& v) { return NonNegative("timeout", v, &o.timeout_seconds); }},
      {"bad-fraction",
       [&](const std::string& v) { return NonNegative("bad-fraction", v, &o.bad_fraction); }},
      {"seed",
       [&](const std::string& v) {
         return absl::SimpleAtoi(v, &o.seed) ? absl::OkStatus()
                                             : BadValue("seed", v, "a non-negative integer");
       }},
      {"rate",
       [&](const std::string& v) {
         o.rates.clear();
         for (const std::string& part : Split(v)) {
           double rate = 0;
           if (!absl::SimpleAtod(part, &rate)) return BadValue("rate", v, "numbers");
           o.rates.push_back(rate);
         }
         return o.rates.empty() ? BadValue("rate", v, "a list") : absl::OkStatus();
       }},
      {"arrivals",
       [&](const std::string& v) {
         if (v == "poisson") {
           o.arrivals = Arrivals::kPoisson;
         } else if (v == "constant") {
           o.arrivals = Arrivals::kConstant;
         } else {
           return BadValue("arrivals", v, "poisson or constant");
         }
         return absl::OkStatus();
       }},
  };
  const std::map<std::string, bool*> switches = {
      {"quiet", &o.quiet}, {"allow-dirty", &o.allow_dirty}, {"help", &o.help}};

  for (int i = 0; i < argc; ++i) absl::StrAppend(&o.command, i ? " " : "", argv[i]);
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    if (auto s = switches.find(name); s != switches.end()) {
      if (eq != std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value"));
      }
      *s->second = true;
      continue;
    }
    auto flag = flags.find(name);
    if (flag == flags.end()) {
      if (name == "impl-suffix") {
        return absl::InvalidArgumentError(
            "--impl-suffix was replaced by --server-label=NAME (a field of each record)");
      }
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name, " (see --help)"));
    }
    if (eq == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, " needs a value: --", name, "=..."));
    }
    if (absl::Status s = flag->second(arg.substr(eq + 1)); !s.ok()) return s;
  }
  if (o.help) return o;
  if (absl::Status s = Validate(o, concurrency_given); !s.ok()) return s;
  return o;
}

}  // namespace probesidecar::bench
