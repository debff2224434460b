// probe-bench: end-to-end RPC latency and throughput of a running probe-sidecar, next to a bare
// gRPC echo of the same transport and payload size (bench/rpc/echo_server.cc).
//
//   probe-bench --target=unix:/tmp/s.sock --echo-target=unix:/tmp/e.sock --transport=uds
//               --out=rpc_uds.json [--rows=1,64,1024,8192] [--probes=1,16] [--hidden=4096]
//               [--concurrency=1,16] [--modes=echo,score_ipc,score_inline] [--seconds=1.5]
//
// score_ipc reads activations [T, H] bf16 from this process's GPU memory, registered over CUDA
// IPC; score_inline sends the R rows in the request. Each client thread has its own connection.
// Latency is measured per call on the client (p50/p90/p99 over every call of every thread).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/rpc/echo.grpc.pb.h"
#include "client/cpp/client.h"
#include "client/cpp/cuda_buffer.h"
#include "client/cpp/session.h"
#include "common/dtype.h"
#include "nlohmann/json.hpp"
#include "common/safetensors.h"

namespace probesidecar::client {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string target, echo_target, transport = "uds", out, git = "unknown", command;
  std::string impl_suffix;  // appended to the score impl names (server variants, e.g. "_untimed")
  std::vector<int> rows = {1, 64, 1024, 8192};
  std::vector<int> probes = {1, 16};
  std::vector<int> concurrency = {1, 16};
  std::vector<std::string> modes = {"echo", "score_ipc", "score_inline"};
  int hidden = 4096;
  int tokens = 16384;
  double seconds = 1.5;
  int warmup = 100;
};

std::vector<int> Ints(const std::string& text) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int v = 0;
    if (absl::SimpleAtoi(part, &v)) out.push_back(v);
  }
  return out;
}

bool Parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos) return false;
    const std::string key = arg.substr(2, eq - 2), value = arg.substr(eq + 1);
    if (key == "target") o->target = value;
    else if (key == "echo-target") o->echo_target = value;
    else if (key == "transport") o->transport = value;
    else if (key == "out") o->out = value;
    else if (key == "git") o->git = value;
    else if (key == "impl-suffix") o->impl_suffix = value;
    else if (key == "rows") o->rows = Ints(value);
    else if (key == "probes") o->probes = Ints(value);
    else if (key == "concurrency") o->concurrency = Ints(value);
    else if (key == "modes") o->modes = absl::StrSplit(value, ',');
    else if (key == "hidden") o->hidden = Ints(value).at(0);
    else if (key == "tokens") o->tokens = Ints(value).at(0);
    else if (key == "warmup") o->warmup = Ints(value).at(0);
    else if (key == "seconds") { if (!absl::SimpleAtod(value, &o->seconds)) return false; }
    else return false;
  }
  for (int i = 0; i < argc; ++i) o->command += (i ? " " : "") + std::string(argv[i]);
  return !o->target.empty() && !o->out.empty();
}

// A connection of its own per client thread (a local subchannel pool), as separate processes
// would have.
std::shared_ptr<grpc::Channel> OwnChannel(const std::string& target) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(1 << 30);
  args.SetMaxSendMessageSize(1 << 30);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

std::string RandomBf16(size_t elements, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::string bytes(elements * 2, '\0');
  for (size_t i = 0; i < elements; ++i) {
    const uint16_t v = common::FloatToBf16(normal(rng));
    std::memcpy(&bytes[i * 2], &v, 2);
  }
  return bytes;
}

struct Point {
  std::vector<double> latency_us;
  int64_t calls = 0;
  int64_t errors = 0;
  double seconds = 0;
  std::string first_error;
};

// Runs `call` from `threads` threads for `seconds` after `warmup` calls each.
template <typename MakeCall>
Point Measure(int threads, int warmup, double seconds, MakeCall make_call) {
  std::vector<std::vector<double>> samples(threads);
  std::atomic<int64_t> errors{0};
  std::vector<std::string> first_error(threads);
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> workers;
  Clock::time_point start, stop;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      auto call = make_call(t);
      for (int i = 0; i < warmup; ++i) call();
      ++ready;
      while (!go.load()) std::this_thread::yield();
      const Clock::time_point end = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                       std::chrono::duration<double>(seconds));
      samples[t].reserve(1 << 16);
      while (true) {
        const Clock::time_point begin = Clock::now();
        if (begin >= end) break;
        const grpc::Status status = call();
        samples[t].push_back(std::chrono::duration<double, std::micro>(Clock::now() - begin).count());
        if (!status.ok()) {
          if (errors++ == 0) first_error[t] = status.error_message();
        }
      }
    });
  }
  while (ready.load() < threads) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  start = Clock::now();
  go = true;
  for (std::thread& w : workers) w.join();
  stop = Clock::now();
  Point p;
  for (auto& s : samples) p.latency_us.insert(p.latency_us.end(), s.begin(), s.end());
  std::sort(p.latency_us.begin(), p.latency_us.end());
  p.calls = static_cast<int64_t>(p.latency_us.size());
  p.errors = errors.load();
  p.seconds = std::chrono::duration<double>(stop - start).count();
  for (const std::string& e : first_error) {
    if (!e.empty()) p.first_error = e;
  }
  return p;
}

double Quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  return sorted[std::min(sorted.size() - 1, static_cast<size_t>(q * (sorted.size() - 1) + 0.5))];
}

double CopyCeilingGbps() {
  const size_t bytes = size_t{1} << 30;
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) return 0;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> ms;
  for (int i = 0; i < 12; ++i) {
    cudaEventRecord(e0);
    cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float t = 0;
    cudaEventElapsedTime(&t, e0, e1);
    if (i >= 2) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes / (ms[ms.size() / 2] * 1e-3) / 1e9;
}

int Run(const Options& o) {
  Client client(o.target, ClientOptions{60.0, 1 << 30});
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    std::fprintf(stderr, "probe-bench: no CUDA device\n");
    return 1;
  }
  // Activations on this process's GPU, registered once.
  const size_t act_elements = static_cast<size_t>(o.tokens) * o.hidden;
  void* activations = nullptr;
  if (cudaMalloc(&activations, act_elements * 2) != cudaSuccess) return 1;
  const std::string host_act = RandomBf16(act_elements, 1);
  cudaMemcpy(activations, host_act.data(), host_act.size(), cudaMemcpyHostToDevice);
  absl::StatusOr<std::unique_ptr<Session>> session = Session::Open(client);
  if (!session.ok()) {
    std::fprintf(stderr, "probe-bench: OpenSession: %s\n", session.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<v1::RegisterBufferResponse> reg = RegisterDeviceMemory(
      client, activations, act_elements * 2, "probe-bench activations", (*session)->id());
  if (!reg.ok()) {
    std::fprintf(stderr, "probe-bench: RegisterBuffer: %s\n", reg.status().ToString().c_str());
    return 1;
  }
  for (int p : o.probes) {
    const std::string w = RandomBf16(static_cast<size_t>(p) * o.hidden, 2 + p);
    const std::string b = RandomBf16(p, 3 + p);
    const std::string file = common::WriteSafetensors(
        {{"weight", "BF16", {p, o.hidden}, w}, {"bias", "BF16", {p}, b}}, {});
    absl::StatusOr<v1::ProbeSetInfo> loaded =
        client.LoadProbeSetFromBytes(absl::StrCat("bench_p", p), file, /*replace=*/true);
    if (!loaded.ok()) {
      std::fprintf(stderr, "probe-bench: LoadProbeSet: %s\n", loaded.status().ToString().c_str());
      return 1;
    }
  }

  nlohmann::json records = nlohmann::json::array();
  std::mt19937 rng(7);
  for (int rows : o.rows) {
    for (int p : o.probes) {
      // Eight row sets per shape, rotated, so that no two consecutive calls read the same rows.
      std::vector<v1::ScoreRequest> ipc(8);
      for (auto& r : ipc) {
        *r.mutable_activations() =
            BufferTensor(v1::DTYPE_BFLOAT16, o.tokens, o.hidden, reg->buffer_id());
        for (int i = 0; i < rows; ++i) r.add_rows(static_cast<int32_t>(rng() % o.tokens));
        r.set_probe_set(absl::StrCat("bench_p", p));
      }
      v1::ScoreRequest inline_request;
      *inline_request.mutable_activations() = InlineTensor(
          v1::DTYPE_BFLOAT16, rows, o.hidden, host_act.substr(0, size_t{2} * rows * o.hidden));
      for (int i = 0; i < rows; ++i) inline_request.add_rows(i);
      inline_request.set_probe_set(absl::StrCat("bench_p", p));
      probesidecar::bench::EchoRequest echo;
      echo.set_payload(std::string(ipc[0].ByteSizeLong(), 'x'));
      echo.set_response_bytes(static_cast<uint32_t>(rows * p * 4 + 16));

      for (int c : o.concurrency) {
        for (const std::string& mode : o.modes) {
          Point point;
          if (mode == "echo") {
            if (o.echo_target.empty()) continue;
            point = Measure(c, o.warmup, o.seconds, [&](int) {
              auto stub = probesidecar::bench::Echo::NewStub(OwnChannel(o.echo_target));
              return [stub = std::shared_ptr(std::move(stub)), &echo] {
                grpc::ClientContext ctx;
                probesidecar::bench::EchoResponse response;
                return stub->Echo(&ctx, echo, &response);
              };
            });
          } else {
            const bool is_ipc = mode == "score_ipc";
            point = Measure(c, o.warmup, o.seconds, [&](int t) {
              auto stub = v1::ProbeSidecar::NewStub(OwnChannel(o.target));
              return [stub = std::shared_ptr(std::move(stub)), &ipc, &inline_request, is_ipc,
                      i = t]() mutable {
                grpc::ClientContext ctx;
                v1::ScoreResponse response;
                const v1::ScoreRequest& request = is_ipc ? ipc[i++ % ipc.size()] : inline_request;
                return stub->Score(&ctx, request, &response);
              };
            });
          }
          nlohmann::json record = {
              {"bench", "rpc_score"},
              {"impl", mode == "echo" ? mode : mode + o.impl_suffix},
              {"dtype", "bf16"},
              {"shape",
               {{"R", rows}, {"H", o.hidden}, {"P", p}, {"concurrency", c},
                {"transport", o.transport}}},
              {"graph_us_p50", nullptr},
              {"eager_us_p50", nullptr},
              {"latency_us",
               {{"p50", Quantile(point.latency_us, 0.5)},
                {"p90", Quantile(point.latency_us, 0.9)},
                {"p99", Quantile(point.latency_us, 0.99)}}},
              {"throughput_rps", point.calls / point.seconds},
              {"calls", point.calls},
              {"errors", point.errors},
              {"request_bytes",
               mode == "score_inline" ? inline_request.ByteSizeLong() : ipc[0].ByteSizeLong()}};
          if (!point.first_error.empty()) record["first_error"] = point.first_error;
          std::printf("%-12s %-4s R=%-5d P=%-3d c=%-3d p50 %8.1f us  p99 %8.1f us  %9.0f rps%s\n",
                      mode.c_str(), o.transport.c_str(), rows, p, c,
                      Quantile(point.latency_us, 0.5), Quantile(point.latency_us, 0.99),
                      point.calls / point.seconds,
                      point.errors ? absl::StrCat("  ERRORS ", point.errors, ": ",
                                                  point.first_error).c_str()
                                   : "");
          std::fflush(stdout);
          records.push_back(record);
        }
      }
    }
  }
  nlohmann::json out = {
      {"device", prop.name},
      {"git", o.git},
      {"date", absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone())},
      {"command", o.command},
      {"ceilings", {{"copy_gbps", CopyCeilingGbps()}, {"bf16_tflops", nullptr}}},
      {"records", records}};
  std::ofstream(o.out) << out.dump(1) << "\n";
  client.UnregisterBuffer(reg->buffer_id()).IgnoreError();
  session->reset();
  cudaFree(activations);
  return 0;
}

}  // namespace
}  // namespace probesidecar::client

int main(int argc, char** argv) {
  probesidecar::client::Options options;
  if (!probesidecar::client::Parse(argc, argv, &options)) {
    std::fprintf(stderr,
                 "usage: probe-bench --target=ADDR --out=FILE.json [--echo-target=ADDR] "
                 "[--transport=uds|tcp] [--rows=1,64,1024,8192] [--probes=1,16] [--hidden=4096] "
                 "[--tokens=16384] [--concurrency=1,16] [--modes=echo,score_ipc,score_inline] "
                 "[--seconds=1.5] [--warmup=100] [--git=HASH] [--impl-suffix=_variant]\n");
    return 2;
  }
  return probesidecar::client::Run(options);
}
