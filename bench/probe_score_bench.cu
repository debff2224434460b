// probe-score-bench: times every probe-scoring path under CUDA-graph replay and eagerly, on
// activations far larger than L2 (a 2 GiB pool, random rows, rotating among 8 request slots),
// measures the two ceilings (device-to-device copy, large cuBLAS bf16 GEMM) in the same run,
// and writes a results JSON (device, git, date, command, ceilings, records) for bench/results/.
//
//   probe-score-bench --out FILE.json [--sweep full|quick|targets|outcomes] [--variants]
//                     [--git HASH[+dirty]] [--allow-dirty]
//
// --sweep outcomes: what counting probe outcomes costs (kernels/probe_outcomes): per shape, the
// dispatcher's path alone ("dispatch"), followed by the outcome count in stream order
// ("dispatch+outcomes"), as its programmatic dependent ("dispatch+outcomes_pdl", what the server
// runs), and so with the request's non-finite count published ("dispatch+outcomes_pdl_publish":
// a synchronous request with a device output); with counting off (--probe-outcomes=off, or the
// set's option), what is left of the count where the answer needs it: the non-finite count of a
// synchronous device output ("dispatch+off_publish", counting nothing); an asynchronous device
// output then has no count kernel at all (its graph is "dispatch"'s). And the floor of any
// kernel after the scoring kernels ("dispatch+empty_pdl": one block that waits and exits, as a
// programmatic dependent). Sigmoid scores, interleaved over rounds (graph_us_rounds) so that
// drift affects every variant alike.
//   probe-score-bench --dispatch-table FILE.txt [--sms 132]   (the dispatcher's path, and the
//                      fused_tc plan, per sweep shape; host only, no GPU)
//
// Receipts: the results name the full commit measured, from --git or $PROBE_SIDECAR_GIT; without
// one, or with a "+dirty" one and no --allow-dirty, nothing is measured (bench/result_receipt.h).
//
// Plain CUDA + events (no Google Benchmark: it is a shared library the GPU machine lacks).
// Times are device time: a spin kernel holds the stream while all timed work is queued, so that
// host launch overhead does not leak into the events; each repetition is bracketed by its own
// pair of events and the median is reported.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/dtype.h"
#include "bench/result_receipt.h"
#include "kernels/blocks/grid_dependency.cuh"
#include "kernels/blocks/launch.cuh"
#include "kernels/probe_outcomes/probe_outcomes.h"
#include "kernels/probe_score/probe_score.h"

namespace ps = probesidecar::kernels;
namespace pc = probesidecar::common;

namespace {

#define CHECK_CUDA(expr)                                                 \
  do {                                                                   \
    const cudaError_t err_ = (expr);                                     \
    if (err_ != cudaSuccess) {                                           \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, \
                   cudaGetErrorString(err_));                            \
      return false;                                                      \
    }                                                                    \
  } while (0)

constexpr int kSlots = 8;                       // request slots the timed replays rotate over
constexpr size_t kPoolBytes = size_t{2} << 30;  // activation pool, 33x the H200's L2

__device__ uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Random values in [-1, 1) of the given dtype (never zeros: zeros run faster than real data).
// Any grid (grid-stride loop).
__global__ void FillRandom(void* buf, int dtype, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v =
        static_cast<float>((Mix(seed ^ static_cast<uint64_t>(i)) >> 40) * (2.0 / 16777216.0) - 1.0);
    if (dtype == 0) {
      static_cast<float*>(buf)[i] = v;
    } else if (dtype == 1) {
      static_cast<__half*>(buf)[i] = __float2half_rn(v);
    } else {
      static_cast<__nv_bfloat16*>(buf)[i] = __float2bfloat16_rn(v);
    }
  }
}

// Holds the stream for `ns` nanoseconds so that the work queued behind it runs back to back.
// Launched as <<<1, 1>>>.
__global__ void Spin(int64_t ns) {
  int64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

double Median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Times `fn` (which enqueues one repetition on `stream`) `reps` times; returns the median in µs.
template <typename Fn>
bool TimeMedianUs(cudaStream_t stream, int reps, int warmup, Fn fn, double* median_us,
                  double spin_us_per_rep = 8.0) {
  for (int i = 0; i < warmup; ++i) {
    if (!fn(i)) return false;
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<cudaEvent_t> ev(2 * reps);
  for (auto& e : ev) CHECK_CUDA(cudaEventCreate(&e));
  Spin<<<1, 1, 0, stream>>>(static_cast<int64_t>((1000.0 + spin_us_per_rep * reps) * 1000.0));
  CHECK_CUDA(cudaGetLastError());
  for (int i = 0; i < reps; ++i) {
    CHECK_CUDA(cudaEventRecord(ev[2 * i], stream));
    if (!fn(i)) return false;
    CHECK_CUDA(cudaEventRecord(ev[2 * i + 1], stream));
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<double> us(reps);
  for (int i = 0; i < reps; ++i) {
    float ms = 0.0f;
    CHECK_CUDA(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
    us[i] = ms * 1000.0;
  }
  for (auto& e : ev) CHECK_CUDA(cudaEventDestroy(e));
  *median_us = Median(us);
  return true;
}

struct Ceilings {
  double copy_gbps = 0.0;
  double bf16_tflops = 0.0;
};

bool MeasureCeilings(cudaStream_t stream, void* pool, Ceilings* c) {
  // Device-to-device copy: 1 GiB -> 1 GiB within the pool, bytes read + written.
  const size_t bytes = kPoolBytes / 2;
  double us = 0.0;
  auto copy = [&](int) {
    return cudaMemcpyAsync(static_cast<char*>(pool) + bytes, pool, bytes, cudaMemcpyDeviceToDevice,
                           stream) == cudaSuccess;
  };
  if (!TimeMedianUs(stream, 20, 3, copy, &us, 0.0)) return false;
  c->copy_gbps = 2.0 * bytes / (us * 1e-6) / 1e9;

  // cuBLAS bf16 GEMM 8192^3 on random data (bf16 out, fp32 compute), like torch.matmul.
  const int n = 8192;
  void* abc = nullptr;
  CHECK_CUDA(cudaMalloc(&abc, size_t{3} * n * n * 2));
  FillRandom<<<4096, 256, 0, stream>>>(abc, 2, int64_t{3} * n * n, 12345);
  CHECK_CUDA(cudaGetLastError());
  cublasHandle_t h = nullptr;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return false;
  if (cublasSetStream(h, stream) != CUBLAS_STATUS_SUCCESS) return false;
  const float one = 1.0f, zero = 0.0f;
  char* a = static_cast<char*>(abc);
  char* b = a + size_t{2} * n * n;
  char* cc = b + size_t{2} * n * n;
  auto gemm = [&](int) {
    return cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, CUDA_R_16BF, n, b,
                        CUDA_R_16BF, n, &zero, cc, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
  };
  const bool ok = TimeMedianUs(stream, 10, 3, gemm, &us, 0.0);
  if (cublasDestroy(h) != CUBLAS_STATUS_SUCCESS) return false;
  CHECK_CUDA(cudaFree(abc));
  if (!ok) return false;
  c->bf16_tflops = 2.0 * n * n * double(n) / (us * 1e-6) / 1e12;
  return true;
}

// Every shape of every sweep fits: R <= 8192, H <= 8192, P <= 1024.
// --family: plan as on a GPU of that family (its shared-memory and thread limits, no
// gather_wgmma off sm_90) on the GPU in hand.
const ps::DeviceFamily* g_family = nullptr;

ps::ProbeScoreWorkspaceConfig BenchWorkspaceConfig() {
  ps::ProbeScoreWorkspaceConfig config;
  config.max_rows = 8192;
  config.max_hidden = 8192;
  config.max_probes = 1024;
  config.limit_to_family = g_family;
  return config;
}

struct Shape {
  pc::DType dtype;
  int32_t R, H, P;
};

std::vector<Shape> Sweep(const std::string& name) {
  std::vector<Shape> s;
  using D = pc::DType;
  if (name == "quick") {
    for (int R : {1, 64, 8192}) {
      for (int P : {1, 16, 1024}) s.push_back({D::kBFloat16, R, 4096, P});
    }
    s.push_back({D::kFloat32, 8192, 4096, 16});
    return s;
  }
  if (name == "outcomes") {
    // R = 1024: the Score of a tap's window (16 decode steps of a batch of 64); then the quick
    // sweep's shapes that are not already there.
    for (int R : {1, 64, 1024, 8192}) {
      for (int P : {4, 64, 1024}) s.push_back({D::kBFloat16, R, 4096, P});
    }
    for (const Shape& q : Sweep("quick")) {
      if (std::none_of(s.begin(), s.end(), [&](const Shape& o) {
            return o.dtype == q.dtype && o.R == q.R && o.H == q.H && o.P == q.P;
          })) {
        s.push_back(q);
      }
    }
    return s;
  }
  if (name == "targets") {
    for (int R : {1, 8, 64}) {
      for (int P : {1, 16, 128, 1024}) s.push_back({D::kBFloat16, R, 4096, P});
    }
    for (int H : {4096, 8192}) {
      for (int P : {1, 16}) s.push_back({D::kBFloat16, 8192, H, P});
    }
    s.push_back({D::kBFloat16, 8192, 4096, 1024});
    return s;
  }
  // full
  for (int R : {1, 8, 64, 256, 1024, 4096, 8192}) {
    for (int P : {1, 4, 16, 64, 128, 256, 1024}) s.push_back({D::kBFloat16, R, 4096, P});
  }
  for (int R : {1, 64, 1024, 8192}) {
    for (int P : {1, 16, 128, 1024}) s.push_back({D::kBFloat16, R, 8192, P});
  }
  for (int R : {1, 64, 8192}) {
    for (int P : {1, 16, 1024}) s.push_back({D::kFloat16, R, 4096, P});
  }
  for (int R : {1, 64, 1024, 8192}) {
    for (int P : {1, 4, 16, 64, 128, 1024}) s.push_back({D::kFloat32, R, 4096, P});
  }
  return s;
}

// "fused_tc", or "fused_tc+exact" when the shape's precision is exact and the path's 16-bit
// weights are its three terms (fused_cuda and float32 activations use the float32 weights).
std::string ImplName(ps::ProbeScorePath path, const ps::ProbeScoreShape& shape) {
  std::string name = ps::ProbeScorePathName(path);
  if (shape.precision == ps::ProbePrecision::kExact && shape.dtype != pc::DType::kFloat32 &&
      path != ps::ProbeScorePath::kFusedCuda) {
    name += "+exact";
  }
  return name;
}

struct Record {
  std::string impl;  // a path name, "+exact" for exact precision; or "dispatch"
  std::string precision = "fast";
  std::string variant;
  std::string path;  // for impl "dispatch": the path it took
  Shape shape;
  double graph_us = NAN, eager_us = NAN;
  std::vector<double> graph_us_rounds;  // --sweep outcomes: each round's median
};

// What follows the scoring kernels in the graph a variant times (--sweep outcomes).
enum class Counting {
  kNone,
  kStreamOrder,
  kProgrammatic,
  // As the server's graph of a synchronous request with a device output: its non-finite count
  // published (the last block's ticket).
  kProgrammaticPublish,
  // The same for a set whose outcomes are not counted: the count kernel publishes the request's
  // non-finite count and counts nothing (no counters, no running total).
  kOffPublish,
  // The floor of any kernel after the scoring kernels: one block that waits for them and exits
  // (as a programmatic dependent, as the count is launched), reading and writing nothing.
  kEmptyProgrammatic,
};

// kEmptyProgrammatic's kernel.
__global__ void EmptyDependentKernel(int unused) {
  (void)unused;
  ps::blocks::GridDependencyWait();
}

std::string JsonNum(double v, int prec = 4) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*g", prec + 2, v);
  return buf;
}

std::string JsonStr(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      o += ' ';
    } else {
      o += c;
    }
  }
  return o + "\"";
}

double MinBytes(const Shape& s) {
  const double e = pc::DTypeSize(s.dtype);
  return double(s.R) * s.H * e + double(s.P) * s.H * e + double(s.R) * s.P * 4 + double(s.R) * 4;
}
double Flops(const Shape& s) { return 2.0 * s.R * double(s.H) * s.P; }

class Bench {
 public:
  bool Init() {
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CHECK_CUDA(cudaMalloc(&pool_, kPoolBytes));
    CHECK_CUDA(ps::CreateProbeScoreWorkspace(BenchWorkspaceConfig(), stream_, &ws_));
    CHECK_CUDA(cudaMalloc(&out_, size_t{8192} * 1024 * 4));
    CHECK_CUDA(cudaMalloc(&args_d_, kSlots * sizeof(ps::ProbeScoreDeviceArgs)));
    CHECK_CUDA(cudaMalloc(&rows_d_, size_t{kSlots} * 8192 * 4));
    CHECK_CUDA(cudaMalloc(&outcome_d_, 3 * kSlots * sizeof(ps::ProbeOutcomeDescriptor)));
    CHECK_CUDA(cudaMalloc(&count_scratch_, 2 * sizeof(uint32_t)));
    CHECK_CUDA(cudaMemset(count_scratch_, 0, 2 * sizeof(uint32_t)));
    CHECK_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&non_finite_), sizeof(uint32_t),
                             cudaHostAllocMapped));
    CHECK_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&non_finite_d_), non_finite_, 0));
    CHECK_CUDA(cudaMalloc(&non_finite_total_, sizeof(unsigned long long)));
    CHECK_CUDA(cudaMemset(non_finite_total_, 0, sizeof(unsigned long long)));
    return true;
  }

  bool FillPool(pc::DType dtype) {
    if (pool_dtype_ == static_cast<int>(dtype)) return true;
    const int64_t n = static_cast<int64_t>(kPoolBytes / pc::DTypeSize(dtype));
    FillRandom<<<8192, 256, 0, stream_>>>(pool_, static_cast<int>(dtype), n, 777);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaStreamSynchronize(stream_));
    pool_dtype_ = static_cast<int>(dtype);
    return true;
  }

  // The probe set (P, H) with `precision`; both precisions of one set stay alive together.
  const ps::ProbeWeights* Weights(int32_t P, int32_t H, ps::ProbePrecision precision) {
    const auto key = std::make_tuple(P, H, static_cast<int>(precision));
    auto it = weights_.find(key);
    if (it != weights_.end()) return &it->second;
    for (auto it2 = weights_.begin(); it2 != weights_.end();) {  // the sweep is ordered by (P, H)
      if (std::get<0>(it2->first) == P && std::get<1>(it2->first) == H) {
        ++it2;
        continue;
      }
      ps::DestroyProbeWeights(&it2->second);
      it2 = weights_.erase(it2);
    }
    std::mt19937_64 rng(P * 131 + H);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> w(static_cast<size_t>(P) * H), b(P);
    const float scale = 1.0f / std::sqrt(static_cast<float>(H));
    for (auto& v : w) v = u(rng) * scale;
    for (auto& v : b) v = u(rng);
    ps::ProbeWeights pw;
    if (ps::CreateProbeWeights(w.data(), b.data(), P, H, precision, &pw) != cudaSuccess)
      return nullptr;
    return &weights_.emplace(key, pw).first->second;
  }

  // Random rows over the whole pool for each slot; args point into the pool.
  bool SetupSlots(const Shape& s) {
    const int64_t T = static_cast<int64_t>(kPoolBytes / (size_t(s.H) * pc::DTypeSize(s.dtype)));
    std::mt19937_64 rng(s.R * 7 + s.H * 3 + s.P);
    std::vector<int32_t> rows(size_t{kSlots} * 8192);
    for (auto& r : rows) r = static_cast<int32_t>(rng() % T);
    CHECK_CUDA(cudaMemcpy(rows_d_, rows.data(), rows.size() * 4, cudaMemcpyHostToDevice));
    std::vector<ps::ProbeScoreDeviceArgs> args(kSlots);
    for (auto& a : args) {
      a.x = pool_;
      a.x_row_stride = s.H;
      a.out = out_;
      a.out_row_stride = s.P;
      a.num_rows = s.R;
    }
    CHECK_CUDA(
        cudaMemcpy(args_d_, args.data(), args.size() * sizeof(args[0]), cudaMemcpyHostToDevice));
    return true;
  }

  // The outcome count's tables and counters for P probes (thresholds 0.5, the sigmoid buckets, as
  // a server would have them), and a descriptor per request slot over that slot's scores.
  bool SetupCounting(const Shape& s) {
    if (outcome_probes_ != s.P) {
      ps::DestroyProbeOutcomeTables(&tables_);
      cudaFree(counters_);
      const ps::ProbeOutcomeLayout layout{s.P, 20};
      std::vector<float> thresholds(s.P, 0.5f), bounds;
      for (int k = 1; k <= 20; ++k) bounds.push_back(0.05f * k);
      CHECK_CUDA(ps::CreateProbeOutcomeTables(thresholds.data(), bounds.data(), layout, &tables_));
      CHECK_CUDA(ps::CreateProbeOutcomeCounters(layout, stream_, &counters_));
      CHECK_CUDA(cudaStreamSynchronize(stream_));
      outcome_probes_ = s.P;
    }
    // [0, kSlots): as the server counts a request (add_to_total); [kSlots, 2 kSlots): the same,
    // its non-finite count published; [2 kSlots, 3 kSlots): published, nothing counted.
    std::vector<ps::ProbeOutcomeDescriptor> d(3 * kSlots);
    for (size_t i = 0; i < d.size(); ++i) {
      const bool counted = i < 2 * kSlots;
      d[i].scores = out_;
      d[i].scores_row_stride = s.P;
      d[i].counters = counted ? counters_ : nullptr;
      d[i].num_rows = s.R;
      d[i].add_to_total = counted ? 1 : 0;
      d[i].publish_count = i >= kSlots ? 1 : 0;
    }
    CHECK_CUDA(cudaMemcpy(outcome_d_, d.data(), d.size() * sizeof(d[0]), cudaMemcpyHostToDevice));
    return true;
  }

  // The scoring launches of request slot `slot`, then the outcome count as `counting` says.
  cudaError_t Launch(const ps::ProbeScorePlan& plan, const ps::ProbeWeights* w, int slot,
                     Counting counting) {
    const cudaError_t e = ps::LaunchProbeScore(plan, Params(w, slot), ws_, stream_);
    if (e != cudaSuccess || counting == Counting::kNone) return e;
    if (counting == Counting::kEmptyProgrammatic) {
      const cudaError_t le = ps::blocks::LaunchProgrammaticDependent(
          EmptyDependentKernel, dim3(1), dim3(32), 0, stream_, 0);
      return le != cudaSuccess ? le : cudaGetLastError();
    }
    ps::CountProbeOutcomesParams count;
    count.descriptor = outcome_d_ + slot +
                       (counting == Counting::kProgrammaticPublish ? kSlots
                        : counting == Counting::kOffPublish        ? 2 * kSlots
                                                                   : 0);
    count.thresholds = tables_.thresholds;
    count.bounds = tables_.bounds;
    count.num_probes = plan.shape.num_probes;
    count.num_bounds = 20;
    count.bucket = plan.shape.max_rows;
    count.scratch = count_scratch_;
    count.non_finite_total = non_finite_total_;
    count.request_non_finite = non_finite_d_;
    return ps::LaunchCountProbeOutcomes(count, stream_,
                                        counting == Counting::kStreamOrder
                                            ? ps::OutcomeLaunch::kStreamOrder
                                            : ps::OutcomeLaunch::kProgrammatic);
  }

  ps::ProbeScoreParams Params(const ps::ProbeWeights* w, int slot) const {
    ps::ProbeScoreParams p;
    p.args = args_d_ + slot;
    p.rows = rows_d_ + size_t{8192} * slot;
    p.weights = w;
    p.activation = activation_;
    return p;
  }

  // Graph replay and eager medians of one plan (made once, as the server makes it per graph).
  bool Measure(const ps::ProbeScorePlan& plan, const ps::ProbeWeights* w, Record* rec,
               Counting counting = Counting::kNone) {
    // Rough single-run time decides the repetitions (~40 ms of work per mode, 10..200).
    double once = 0.0;
    auto eager = [&](int i) { return Launch(plan, w, i % kSlots, counting) == cudaSuccess; };
    if (!TimeMedianUs(stream_, 3, 1, eager, &once)) return false;
    const int reps = std::clamp(static_cast<int>(40000.0 / std::max(once, 1.0)), 10, 200);
    if (!TimeMedianUs(stream_, reps, 3, eager, &rec->eager_us)) return false;

    cudaGraphExec_t exec[kSlots] = {};
    for (int k = 0; k < kSlots; ++k) {
      cudaGraph_t g = nullptr;
      CHECK_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      const cudaError_t le = Launch(plan, w, k, counting);
      CHECK_CUDA(cudaStreamEndCapture(stream_, &g));
      CHECK_CUDA(le);
      CHECK_CUDA(cudaGraphInstantiate(&exec[k], g, 0));
      CHECK_CUDA(cudaGraphDestroy(g));
    }
    auto replay = [&](int i) { return cudaGraphLaunch(exec[i % kSlots], stream_) == cudaSuccess; };
    const bool ok = TimeMedianUs(stream_, reps, 3, replay, &rec->graph_us);
    for (auto& e : exec) CHECK_CUDA(cudaGraphExecDestroy(e));
    return ok;
  }

  // --sweep outcomes: the dispatcher's path (the default precision) alone and followed by the
  // outcome count both ways, interleaved over `rounds` rounds.
  bool RunOutcomes(const std::vector<Shape>& shapes, int rounds, std::vector<Record>* records) {
    activation_ = ps::Activation::kSigmoid;
    std::printf("%-5s %5s %5s %5s  %-22s %10s %10s  %s\n", "dtype", "R", "H", "P", "impl",
                "graph_us", "eager_us", "rounds");
    const ps::ProbeScoreResources& res = ps::ProbeScoreWorkspaceResources(*ws_);
    for (const Shape& s : shapes) {
      if (!FillPool(s.dtype) || !SetupSlots(s) || !SetupCounting(s)) return false;
      const ps::ProbePrecision precision =
          ps::ResolveProbePrecision(ps::ProbePrecisionRequest::kDefault, s.P);
      const ps::ProbeScoreShape shape{s.dtype, s.R, s.P, s.H, precision};
      const ps::ProbeScorePath path = ps::ChooseProbeScorePath(shape, res.device);
      const ps::ProbeWeights* w = Weights(s.P, s.H, precision);
      ps::ProbeScorePlan plan;
      if (w == nullptr || ps::PlanProbeScore(shape, path, res, {}, &plan) != cudaSuccess) {
        std::fprintf(stderr, "plan failed: R=%d P=%d\n", s.R, s.P);
        return false;
      }
      const std::pair<const char*, Counting> kVariants[] = {
          {"dispatch", Counting::kNone},
          {"dispatch+outcomes", Counting::kStreamOrder},
          {"dispatch+outcomes_pdl", Counting::kProgrammatic},
          {"dispatch+outcomes_pdl_publish", Counting::kProgrammaticPublish},
          {"dispatch+off_publish", Counting::kOffPublish},
          {"dispatch+empty_pdl", Counting::kEmptyProgrammatic}};
      constexpr int kNumVariants = 6;
      std::vector<Record> recs(kNumVariants);
      for (int round = 0; round < rounds; ++round) {
        for (int v = 0; v < kNumVariants; ++v) {
          // Each round in another order: no variant always runs right after another.
          const int which = (v + round) % kNumVariants;
          Record one;
          if (!Measure(plan, w, &one, kVariants[which].second)) return false;
          recs[which].graph_us_rounds.push_back(one.graph_us);
          recs[which].eager_us = std::isnan(recs[which].eager_us)
                                     ? one.eager_us
                                     : std::min(recs[which].eager_us, one.eager_us);
        }
      }
      for (int v = 0; v < kNumVariants; ++v) {
        Record& r = recs[v];
        r.impl = kVariants[v].first;
        r.path = ImplName(path, shape);
        r.precision = ps::ProbePrecisionName(precision);
        r.shape = s;
        r.variant = ps::DescribeProbeScorePlan(plan);
        r.graph_us = Median(r.graph_us_rounds);
        std::string each;
        for (double us : r.graph_us_rounds) each += (each.empty() ? "" : " ") + JsonNum(us, 2);
        std::printf("%-5s %5d %5d %5d  %-22s %10.2f %10.2f  %s\n", pc::DTypeName(s.dtype), s.R, s.H,
                    s.P, r.impl.c_str(), r.graph_us, r.eager_us, each.c_str());
        std::fflush(stdout);
        records->push_back(r);
      }
    }
    return true;
  }

  bool Run(const std::vector<Shape>& shapes, bool variants, std::vector<Record>* records) {
    std::printf("%-5s %5s %5s %5s  %-22s %10s %10s %8s  %s\n", "dtype", "R", "H", "P", "impl",
                "graph_us", "eager_us", "frac_cp", "plan");
    // Grouped by (dtype, H, P) so that the pool is filled once per dtype and each weight set is
    // created once.
    std::vector<Shape> order = shapes;
    std::stable_sort(order.begin(), order.end(), [](const Shape& a, const Shape& b) {
      return std::make_tuple(static_cast<int>(a.dtype), a.H, a.P, a.R) <
             std::make_tuple(static_cast<int>(b.dtype), b.H, b.P, b.R);
    });
    for (const Shape& s : order) {
      if (!FillPool(s.dtype)) return false;
      if (!SetupSlots(s)) return false;
      const ps::ProbeScoreShape shape{s.dtype, s.R, s.P, s.H, ps::ProbePrecision::kFast};
      const ps::ProbeScoreResources& res = ps::ProbeScoreWorkspaceResources(*ws_);
      // The dispatcher's pick for each precision ("dispatch:fast", "dispatch:exact"), which the
      // report's crossover table holds against the fastest path of that precision; "dispatch" is
      // the pick at the precision a probe set of P probes gets by default.
      std::string chosen_by[2];
      for (ps::ProbePrecision precision : {ps::ProbePrecision::kExact, ps::ProbePrecision::kFast}) {
        ps::ProbeScoreShape p_shape = shape;
        p_shape.precision = precision;
        chosen_by[static_cast<int>(precision)] =
            ImplName(ps::ChooseProbeScorePath(p_shape, res.device), p_shape);
      }
      const std::string& chosen = chosen_by[static_cast<int>(
          ps::ResolveProbePrecision(ps::ProbePrecisionRequest::kDefault, s.P))];
      struct Run {
        std::string impl;
        ps::ProbeScorePath path;
        ps::ProbeScoreTuning tuning;
        ps::ProbePrecision precision = ps::ProbePrecision::kFast;
      };
      std::vector<Run> runs;
      for (ps::ProbePrecision precision : {ps::ProbePrecision::kFast, ps::ProbePrecision::kExact}) {
        ps::ProbeScoreShape ps_shape = shape;
        ps_shape.precision = precision;
        for (int pi = 0; pi < ps::kNumProbeScorePaths; ++pi) {
          const auto path = static_cast<ps::ProbeScorePath>(pi);
          if (!ps::ProbeScorePathSupports(path, ps_shape, res.device)) continue;
          // Exact differs from fast only where 16-bit weights meet the tensor cores.
          if (precision == ps::ProbePrecision::kExact &&
              (s.dtype == pc::DType::kFloat32 || path == ps::ProbeScorePath::kFusedCuda)) {
            continue;
          }
          runs.push_back({ImplName(path, ps_shape), path, ps::ProbeScoreTuning{}, precision});
        }
      }
      if (variants && s.dtype != pc::DType::kFloat32 && s.P >= 64) {
        // gather_wgmma's tiles and split counts where the choice is open.
        for (int cfg = 0; cfg < ps::probe_score_detail::kNumWgmmaConfigs; ++cfg) {
          for (int sp : {0, 4, 8}) {
            if (sp > 0 && (s.R > 256 || ps::probe_score_detail::kWgmmaConfigs[cfg].ws)) continue;
            ps::ProbeScoreTuning t;
            t.wgmma_config = cfg;
            t.splits = sp;
            std::string name =
                std::string("gather_wgmma[") + ps::probe_score_detail::kWgmmaConfigs[cfg].name;
            if (sp > 0) name += ",s" + std::to_string(sp);
            runs.push_back({name + "]", ps::ProbeScorePath::kGatherWgmma, t});
          }
        }
      }
      if (variants && s.dtype != pc::DType::kFloat32) {
        // Tile configurations and split counts of fused_tc where the choice is open.
        auto add = [&](int cfg, int splits) {
          ps::ProbeScoreTuning t;
          t.tc_config = cfg;
          t.splits = splits;
          std::string name =
              std::string("fused_tc[") + ps::probe_score_detail::kTcConfigs[cfg].name;
          if (splits > 0) name += ",s" + std::to_string(splits);
          runs.push_back({name + "]", ps::ProbeScorePath::kFusedTensorCore, t});
        };
        if (s.P <= 16 && s.R >= 1024) {
          for (int cfg : {0, 3, 4}) add(cfg, 0);
        }
        if (s.R <= 64 && s.P >= 64) {
          for (int sp : {4, 8, 16}) add(1, sp);
          add(0, 8);
        }
        if (s.P == 64 && s.R >= 4096) {
          add(1, 1);
          add(2, 0);
        }
      }
      if (variants && s.P >= 128 && s.R >= 4096) {
        ps::ProbeScoreTuning t;
        t.gather_chunk_rows = 2048;
        runs.push_back({"gather_gemm[2048]", ps::ProbeScorePath::kGatherGemm, t});
      }
      for (const Run& run : runs) {
        ps::ProbeScoreShape run_shape = shape;
        run_shape.precision = run.precision;
        const ps::ProbeWeights* w = Weights(s.P, s.H, run.precision);
        ps::ProbeScorePlan plan;
        Record rec;
        rec.impl = run.impl;
        rec.precision = ps::ProbePrecisionName(run.precision);
        rec.shape = s;
        if (w == nullptr ||
            ps::PlanProbeScore(run_shape, run.path, res, run.tuning, &plan) != cudaSuccess ||
            !Measure(plan, w, &rec)) {
          std::fprintf(stderr, "measure failed: %s\n", run.impl.c_str());
          return false;
        }
        rec.variant = ps::DescribeProbeScorePlan(plan);
        Print(rec);
        records->push_back(rec);
        for (ps::ProbePrecision precision :
             {ps::ProbePrecision::kExact, ps::ProbePrecision::kFast}) {
          if (run.impl != chosen_by[static_cast<int>(precision)]) continue;
          Record d = rec;
          d.impl = std::string("dispatch:") + ps::ProbePrecisionName(precision);
          d.path = run.impl;
          records->push_back(d);
        }
        if (run.impl == chosen) {
          Record d = rec;
          d.impl = "dispatch";
          d.path = run.impl;
          records->push_back(d);
        }
      }
    }
    return true;
  }

  void Print(const Record& r) const {
    const double gbps = MinBytes(r.shape) / (r.graph_us * 1e-6) / 1e9;
    std::printf("%-5s %5d %5d %5d  %-22s %10.2f %10.2f %8.3f  %s\n", pc::DTypeName(r.shape.dtype),
                r.shape.R, r.shape.H, r.shape.P, r.impl.c_str(), r.graph_us, r.eager_us,
                gbps / ceilings.copy_gbps, r.variant.c_str());
    std::fflush(stdout);
  }

  Ceilings ceilings;
  cudaStream_t stream_ = nullptr;
  void* pool_ = nullptr;

 private:
  int pool_dtype_ = -1;
  ps::ProbeScoreWorkspace* ws_ = nullptr;
  float* out_ = nullptr;
  ps::ProbeScoreDeviceArgs* args_d_ = nullptr;
  int32_t* rows_d_ = nullptr;
  ps::Activation activation_ = ps::Activation::kNone;
  // --sweep outcomes.
  ps::ProbeOutcomeDescriptor* outcome_d_ = nullptr;  // [2 kSlots]
  ps::ProbeOutcomeTables tables_;
  unsigned long long* counters_ = nullptr;
  int32_t outcome_probes_ = 0;
  uint32_t* count_scratch_ = nullptr;
  uint32_t* non_finite_ = nullptr;  // mapped [2]
  uint32_t* non_finite_d_ = nullptr;
  unsigned long long* non_finite_total_ = nullptr;
  std::map<std::tuple<int32_t, int32_t, int>, ps::ProbeWeights> weights_;
};

// ", \"graph_us_rounds\": [...]" for a record of --sweep outcomes, else "".
std::string Rounds(const Record& r) {
  if (r.graph_us_rounds.empty()) return "";
  std::string out = ", \"graph_us_rounds\": [";
  for (size_t i = 0; i < r.graph_us_rounds.size(); ++i) {
    out += (i ? ", " : "") + JsonNum(r.graph_us_rounds[i]);
  }
  return out + "]";
}

bool WriteJson(const std::string& path, const std::string& device, const std::string& git,
               const std::string& command, const Ceilings& c, const std::vector<Record>& recs) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    return false;
  }
  char date[64];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  std::fprintf(f, "{\n  \"device\": %s,\n  \"git\": %s,\n  \"date\": %s,\n  \"command\": %s,\n",
               JsonStr(device).c_str(), JsonStr(git).c_str(), JsonStr(date).c_str(),
               JsonStr(command).c_str());
  std::fprintf(f, "  \"limit_to_family\": %s,\n",
               g_family != nullptr ? JsonStr(g_family->name).c_str() : "null");
  std::fprintf(f, "  \"ceilings\": {\"copy_gbps\": %s, \"bf16_tflops\": %s},\n  \"records\": [\n",
               JsonNum(c.copy_gbps).c_str(), JsonNum(c.bf16_tflops).c_str());
  for (size_t i = 0; i < recs.size(); ++i) {
    const Record& r = recs[i];
    const double gbps = MinBytes(r.shape) / (r.graph_us * 1e-6) / 1e9;
    const double tflops = Flops(r.shape) / (r.graph_us * 1e-6) / 1e12;
    std::fprintf(
        f,
        "    {\"bench\": \"probe_score\", \"impl\": %s, \"dtype\": \"%s\", "
        "\"shape\": {\"R\": %d, \"H\": %d, \"P\": %d}, \"graph_us_p50\": %s, "
        "\"eager_us_p50\": %s, \"gbps\": %s, \"tflops\": %s, \"frac_copy\": %s, "
        "\"frac_tflops\": %s, \"precision\": \"%s\", \"variant\": %s%s%s%s}%s\n",
        JsonStr(r.impl).c_str(), pc::DTypeName(r.shape.dtype), r.shape.R, r.shape.H, r.shape.P,
        JsonNum(r.graph_us).c_str(), JsonNum(r.eager_us).c_str(), JsonNum(gbps).c_str(),
        JsonNum(tflops).c_str(), JsonNum(gbps / c.copy_gbps).c_str(),
        JsonNum(tflops / c.bf16_tflops).c_str(), r.precision.c_str(), JsonStr(r.variant).c_str(),
        r.path.empty() ? "" : ", \"path\": ", r.path.empty() ? "" : JsonStr(r.path).c_str(),
        Rounds(r).c_str(), i + 1 < recs.size() ? "," : "");
  }
  std::fprintf(f, "  ]\n}\n");
  return std::fclose(f) == 0;
}

// The dispatcher's choice for every shape of the sweeps, and fused_tc's plan on a device of
// `num_sms` SMs (host only, no GPU): lets the report label the "dispatch" column with the code as
// it is now.
bool WriteDispatchTable(const std::string& path, int num_sms) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return false;
  // An sm_90 device with the sm_90a kernels built, as measured (or --family's limits).
  const ps::DeviceFamily& family = g_family != nullptr ? *g_family : *ps::FindDeviceFamily("sm_90");
  ps::ProbeScoreResources res;
  res.device = ps::ProbeScoreFactsFrom(family.limits);
  res.device.num_sms = num_sms;
  res.device.gather_wgmma = family.sm90a;
  res.workspace = ps::ProbeScoreWorkspaceLimitsFor(BenchWorkspaceConfig());
  for (const std::string sw : {"full", "quick", "targets"}) {
    for (const Shape& s : Sweep(sw)) {
      const ps::ProbeScoreShape shape{
          s.dtype, s.R, s.P, s.H,
          ps::ResolveProbePrecision(ps::ProbePrecisionRequest::kDefault, s.P)};
      const ps::ProbeScorePath path = ps::ChooseProbeScorePath(shape, res.device);
      std::fprintf(f, "%s %d %d %d %s", pc::DTypeName(s.dtype), s.R, s.H, s.P,
                   ImplName(path, shape).c_str());
      ps::ProbeScorePlan plan;
      if (path == ps::ProbeScorePath::kFusedTensorCore &&
          ps::PlanProbeScore(shape, path, res, {}, &plan) == cudaSuccess) {
        std::fprintf(f, " %s", ps::DescribeProbeScorePlan(plan).c_str());
      }
      std::fprintf(f, "\n");
    }
  }
  return std::fclose(f) == 0;
}

// 77 only when the machine has no CUDA device (no driver, or none found); 0 when one is usable.
int CheckDevice(cudaDeviceProp* prop) {
  int driver = 0, count = 0;
  const cudaError_t version = cudaDriverGetVersion(&driver);
  const cudaError_t err = cudaGetDeviceCount(&count);
  if ((version == cudaSuccess && driver == 0) || err == cudaErrorNoDevice ||
      (err == cudaSuccess && count == 0)) {
    std::printf("SKIPPED: no CUDA device\n");
    return 77;
  }
  if (err != cudaSuccess) {
    std::fprintf(stderr, "the CUDA runtime cannot count devices: %s\n", cudaGetErrorString(err));
    return 1;
  }
  const cudaError_t props = cudaGetDeviceProperties(prop, 0);
  if (props != cudaSuccess) {
    std::fprintf(stderr, "cudaGetDeviceProperties: %s\n", cudaGetErrorString(props));
    return 1;
  }
  return 0;
}

int Main(int argc, char** argv) {
  std::string out_path, sweep = "full", git_flag;
  bool variants = false, allow_dirty = false;
  int num_sms = 132;  // H200, for --dispatch-table
  std::string command, dispatch_table;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--out" && i + 1 < argc) {
      out_path = argv[++i];
    } else if (a == "--sweep" && i + 1 < argc) {
      sweep = argv[++i];
    } else if (a == "--git" && i + 1 < argc) {
      git_flag = argv[++i];
    } else if (a == "--allow-dirty") {
      allow_dirty = true;
    } else if (a == "--variants") {
      variants = true;
    } else if (a == "--dispatch-table" && i + 1 < argc) {
      dispatch_table = argv[++i];
    } else if (a == "--sms" && i + 1 < argc) {
      num_sms = std::atoi(argv[++i]);
    } else if (a == "--family" && i + 1 < argc) {
      if ((g_family = ps::FindDeviceFamily(argv[++i])) == nullptr) {
        std::fprintf(stderr, "--family %s: no family of kDeviceFamilies\n", argv[i]);
        return 2;
      }
    } else {
      std::fprintf(stderr,
                   "usage: %s --out FILE.json [--sweep full|quick|targets|outcomes] [--variants] "
                   "[--git HASH[+dirty]] [--allow-dirty] [--family sm_86|...] | --dispatch-table "
                   "FILE.txt [--sms N]\n",
                   argv[0]);
      return 2;
    }
  }
  if (!dispatch_table.empty()) return WriteDispatchTable(dispatch_table, num_sms) ? 0 : 1;
  if (out_path.empty()) {
    std::fprintf(stderr, "--out is required\n");
    return 2;
  }
  // The receipt first: nothing is measured that could not be written.
  const std::string git = probesidecar::bench::ResultIdentity(git_flag);
  if (const std::string why = probesidecar::bench::CheckResultIdentity(git, allow_dirty); !why.empty()) {
    std::fprintf(stderr, "probe-score-bench: %s\n", why.c_str());
    return 2;
  }
  cudaDeviceProp prop{};
  if (const int rc = CheckDevice(&prop); rc != 0) return rc;
  Bench bench;
  if (!bench.Init()) return 1;
  if (!MeasureCeilings(bench.stream_, bench.pool_, &bench.ceilings)) return 1;
  std::printf("device %s: copy ceiling %.0f GB/s, bf16 GEMM ceiling %.0f TFLOP/s\n", prop.name,
              bench.ceilings.copy_gbps, bench.ceilings.bf16_tflops);
  std::vector<Record> records;
  const auto t0 = std::chrono::steady_clock::now();
  const bool ok = sweep == "outcomes" ? bench.RunOutcomes(Sweep(sweep), 5, &records)
                                      : bench.Run(Sweep(sweep), variants, &records);
  std::printf("sweep took %.1f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  if (!WriteJson(out_path, prop.name, git, command, bench.ceilings, records)) return 1;
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) { return Main(argc, argv); }
