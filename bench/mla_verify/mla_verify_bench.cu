// MLA verify benchmark: our kernels under CUDA-graph replay over a sweep of shapes (full: 126
// points), with the copy ceiling (cudaMemcpy device to device, bytes read + written per second)
// and the cuBLAS bf16 GEMM ceiling measured in the same run. Plain CUDA events (no Google
// Benchmark).
//
//   mla-verify-bench --out FILE.json --git HASH [--allow-dirty] [--sweep full|quick|targets]
//                    [--impls split_kv,split_kv_sm90a,baseline,...] [--points H:S:B:L,...]
//                    [--skip-ceilings] [--trace-dir DIR [--trace-points H:S:B:L,...]]
//
// --sweep targets: the points bench/results/mla_verify.md holds targets for (and a few short
// ones); --points: only these points (h_q:s_q:batch:len) of the sweep chosen. Impls: split_kv,
// split_kv_sm90a (the plan's schedule: what LaunchMlaVerify runs), baseline, and split_kv_sm90a
// with a schedule forced (split_kv_sm90a_pairs: page pairs; split_kv_sm90a_one_page: one page at
// a time; split_kv_sm90a_swap_ab: swap-AB where s_q * h_q <= 32, the plan's choice elsewhere).
// --trace-dir: in a build with the in-kernel trace (-DPROBESIDECAR_MLA_TRACE=ON), after timing a
// point (of --trace-points, default every point) each split_kv_sm90a* impl runs once more with the
// trace recording, written to DIR/trace_h<h>_s<s>_b<b>_l<len>_<impl>.bin
// (bench/mla_verify/trace_report.py reads them).
//
// Each point: the median of many graph replays after warm-up, rotating over as many input sets
// (cache pages, q, out, tables) as keep the working set above 400 MB (the L2 is 60 MB). Bytes
// counted: KV len * 576 * 2 + q + out per request. FLOPs: 2 * h_q * (576 + 512) per visible
// (query, key) pair, i.e. s_q * len - s_q * (s_q - 1) / 2 pairs per request (the causal
// adjustment). Points whose inputs do not fit in device memory are skipped and listed.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "bench/result_receipt.h"
#include "kernels/mla_verify/mla_verify.h"
#include "kernels/mla_verify/mla_verify_plan.h"
#include "kernels/mla_verify/mla_verify_trace.h"

namespace {

using probesidecar::kernels::MlaVerifyParams;
using probesidecar::kernels::MlaVerifyPath;
using probesidecar::kernels::MlaVerifyWorkspace;

#define CHECK_CUDA(expr)                                                                           \
  do {                                                                                             \
    const cudaError_t err_ = (expr);                                                               \
    if (err_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(err_)); \
      return false;                                                                                \
    }                                                                                              \
  } while (0)

__global__ void FillRandomBf16(__nv_bfloat16* p, size_t n, uint64_t seed, float amp) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint64_t x = seed ^ (i * 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    x ^= x >> 31;
    const float u = ((x >> 40) + 0.5f) * (1.0f / 16777216.0f);
    p[i] = __float2bfloat16_rn((2.0f * u - 1.0f) * amp);
  }
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Ceilings {
  double copy_gbps = 0, bf16_tflops = 0;
};

bool MeasureCeilings(Ceilings* c) {
  // Copy: 2 GiB device to device, median of 15 after 3 warm-ups.
  const size_t bytes = size_t{2} << 30;
  void *a = nullptr, *b = nullptr;
  CHECK_CUDA(cudaMalloc(&a, bytes));
  CHECK_CUDA(cudaMalloc(&b, bytes));
  CHECK_CUDA(cudaMemset(a, 1, bytes));
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  std::vector<double> ms;
  for (int i = 0; i < 18; ++i) {
    CHECK_CUDA(cudaEventRecord(e0));
    CHECK_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
    CHECK_CUDA(cudaEventRecord(e1));
    CHECK_CUDA(cudaEventSynchronize(e1));
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, e0, e1));
    if (i >= 3) ms.push_back(t);
  }
  c->copy_gbps = 2.0 * bytes / (Median(ms) * 1e-3) / 1e9;
  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaFree(b));
  // cuBLAS bf16 GEMM 8192^3 on random data, float32 accumulation.
  const int n = 8192;
  __nv_bfloat16 *A = nullptr, *B = nullptr, *C = nullptr;
  CHECK_CUDA(cudaMalloc(&A, size_t{2} * n * n));
  CHECK_CUDA(cudaMalloc(&B, size_t{2} * n * n));
  CHECK_CUDA(cudaMalloc(&C, size_t{2} * n * n));
  FillRandomBf16<<<1024, 256>>>(A, size_t{n} * n, 1, 1.0f);
  FillRandomBf16<<<1024, 256>>>(B, size_t{n} * n, 2, 1.0f);
  CHECK_CUDA(cudaGetLastError());
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return false;
  const float alpha = 1.0f, beta = 0.0f;
  ms.clear();
  for (int i = 0; i < 13; ++i) {
    CHECK_CUDA(cudaEventRecord(e0));
    if (cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, A, CUDA_R_16BF, n, B,
                     CUDA_R_16BF, n, &beta, C, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
      return false;
    }
    CHECK_CUDA(cudaEventRecord(e1));
    CHECK_CUDA(cudaEventSynchronize(e1));
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, e0, e1));
    if (i >= 3) ms.push_back(t);
  }
  c->bf16_tflops = 2.0 * n * n * static_cast<double>(n) / (Median(ms) * 1e-3) / 1e12;
  cublasDestroy(h);
  CHECK_CUDA(cudaFree(A));
  CHECK_CUDA(cudaFree(B));
  CHECK_CUDA(cudaFree(C));
  CHECK_CUDA(cudaEventDestroy(e0));
  CHECK_CUDA(cudaEventDestroy(e1));
  return true;
}

struct Point {
  int h_q, s_q, batch, len;
};

struct Record {
  Point pt;
  std::string impl;
  std::string tile;         // the portable tile (rows x key stages) for split_kv and baseline
  bool dispatched = false;  // the path LaunchMlaVerify takes for this shape
  double graph_us = 0, eager_us = 0, gbps = 0, tflops = 0;
};

double BytesOf(const Point& p) {
  return static_cast<double>(p.batch) * (static_cast<double>(p.len) * 576 * 2 +
                                         static_cast<double>(p.s_q) * p.h_q * (576 + 512) * 2);
}
double FlopsOf(const Point& p) {
  const double pairs = static_cast<double>(p.s_q) * p.len - p.s_q * (p.s_q - 1) / 2.0;
  return 2.0 * p.h_q * (576 + 512) * pairs * p.batch;
}

// Device pools shared by every point: cache pages, q, out, tables, lengths.
struct Pools {
  __nv_bfloat16* kv = nullptr;
  size_t kv_pages = 0;
  __nv_bfloat16* q = nullptr;
  __nv_bfloat16* out = nullptr;
  size_t q_elems = 0, out_elems = 0;
  int32_t* tables = nullptr;
  size_t table_ints = 0;
  int32_t* lens = nullptr;
};

constexpr double kRotateBytes = 400e6;
constexpr int kMaxSets = 8;

int SetsFor(const Point& p) {
  const double kv = static_cast<double>(p.batch) * p.len * 576 * 2;
  return std::clamp(static_cast<int>(std::ceil(kRotateBytes / kv)), 1, kMaxSets);
}

bool Fits(const Point& p, const Pools& pools) {
  const int sets = SetsFor(p);
  const size_t pages = static_cast<size_t>(p.batch) * ((p.len + 63) / 64);
  return pages * sets <= pools.kv_pages &&
         static_cast<size_t>(sets) * p.batch * p.s_q * p.h_q * 576 <= pools.q_elems &&
         static_cast<size_t>(sets) * p.batch * p.s_q * p.h_q * 512 <= pools.out_elems &&
         static_cast<size_t>(sets) * p.batch * ((p.len + 63) / 64) <= pools.table_ints;
}

// An impl: a path on a workspace.
struct Impl {
  MlaVerifyPath path;
  MlaVerifyWorkspace* ws;
  std::string name;
};

// The trace's file: a header, then the device buffer as recorded (mla_verify_trace.h).
struct TraceHeader {
  char magic[8] = {'M', 'L', 'A', 'T', 'R', 'A', 'C', 'E'};
  int32_t version = 1;
  int32_t max_blocks = 0, events_per_warpgroup = 0;
  int32_t h_q = 0, s_q = 0, batch = 0, len = 0;
  int32_t sm_clock_khz = 0;  // cudaDevAttrClockRate: cycles to time
};
struct Trace {
  std::string dir;
  std::string points;  // ",h:s:b:l,..." or empty (every point)
  uint32_t* buffer = nullptr;
  int32_t max_blocks = 0, events = 0;
  int32_t clock_khz = 0;
  bool Wants(const Point& p) const {
    if (dir.empty()) return false;
    if (points.empty()) return true;
    const std::string key = "," + std::to_string(p.h_q) + ":" + std::to_string(p.s_q) + ":" +
                            std::to_string(p.batch) + ":" + std::to_string(p.len) + ",";
    return points.find(key) != std::string::npos;
  }
};

// One traced run of `impl` on params set 0, written to the trace directory.
bool TraceOnce(const Point& pt, const MlaVerifyParams& params, const Impl& impl, Trace& trace,
               cudaStream_t stream) {
  const size_t words = static_cast<size_t>(trace.max_blocks) * 2 * trace.events * 2;
  CHECK_CUDA(cudaMemsetAsync(trace.buffer, 0, words * 4, stream));
  CHECK_CUDA(
      probesidecar::kernels::SetMlaVerifyTraceBuffer(trace.buffer, trace.max_blocks, trace.events));
  const cudaError_t launch =
      probesidecar::kernels::LaunchMlaVerifyPath(params, impl.path, impl.ws, stream);
  CHECK_CUDA(probesidecar::kernels::SetMlaVerifyTraceBuffer(nullptr, 0, 0));
  CHECK_CUDA(launch);
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<uint32_t> host(words);
  CHECK_CUDA(cudaMemcpy(host.data(), trace.buffer, words * 4, cudaMemcpyDeviceToHost));
  TraceHeader header;
  header.max_blocks = trace.max_blocks;
  header.events_per_warpgroup = trace.events;
  header.h_q = pt.h_q;
  header.s_q = pt.s_q;
  header.batch = pt.batch;
  header.len = pt.len;
  header.sm_clock_khz = trace.clock_khz;
  const std::string path = trace.dir + "/trace_h" + std::to_string(pt.h_q) + "_s" +
                           std::to_string(pt.s_q) + "_b" + std::to_string(pt.batch) + "_l" +
                           std::to_string(pt.len) + "_" + impl.name + ".bin";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    return false;
  }
  // Only the blocks that recorded anything (pair 0 of warpgroup 0 holds a count).
  int32_t used = 0;
  for (int32_t b = 0; b < trace.max_blocks; ++b) {
    if (host[static_cast<size_t>(b) * 2 * trace.events * 2] != 0) used = b + 1;
  }
  header.max_blocks = used;
  std::fwrite(&header, sizeof(header), 1, f);
  std::fwrite(host.data(), 4, static_cast<size_t>(used) * 2 * trace.events * 2, f);
  std::fclose(f);
  return true;
}

bool RunPoint(const Point& pt, const Pools& pools, MlaVerifyWorkspace* dispatch_ws,
              cudaStream_t stream, const std::vector<Impl>& impls, Trace& trace,
              std::vector<Record>* records) {
  const int sets = SetsFor(pt);
  const int max_pages = (pt.len + 63) / 64;
  const size_t pages_per_set = static_cast<size_t>(pt.batch) * max_pages;
  // Tables: set s, request b uses pages s * pages_per_set + b * max_pages + i (in order).
  std::vector<int32_t> table(sets * pages_per_set);
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
  CHECK_CUDA(cudaMemcpy(pools.tables, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  std::vector<int32_t> lens(pt.batch, pt.len);
  CHECK_CUDA(cudaMemcpy(pools.lens, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
  std::vector<MlaVerifyParams> params(sets);
  const size_t q_set = static_cast<size_t>(pt.batch) * pt.s_q * pt.h_q * 576;
  const size_t o_set = static_cast<size_t>(pt.batch) * pt.s_q * pt.h_q * 512;
  for (int s = 0; s < sets; ++s) {
    MlaVerifyParams& p = params[s];
    p.batch = pt.batch;
    p.s_q = pt.s_q;
    p.h_q = pt.h_q;
    p.softmax_scale = 1.0f / std::sqrt(192.0f);
    p.q = pools.q + s * q_set;
    p.q_head_stride = 576;
    p.q_token_stride = pt.h_q * 576;
    p.q_batch_stride = static_cast<int64_t>(pt.s_q) * pt.h_q * 576;
    p.kv_cache = pools.kv;
    p.kv_row_stride = 576;
    p.kv_page_stride = 64 * 576;
    p.num_pages = static_cast<int32_t>(pools.kv_pages);
    p.block_table = pools.tables + s * pages_per_set;
    p.block_table_batch_stride = max_pages;
    p.max_pages = max_pages;
    p.cache_seqlens = pools.lens;
    p.out = pools.out + s * o_set;
    p.out_head_stride = 512;
    p.out_token_stride = pt.h_q * 512;
    p.out_batch_stride = static_cast<int64_t>(pt.s_q) * pt.h_q * 512;
  }
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  for (const Impl& impl : impls) {
    const MlaVerifyPath path = impl.path;
    MlaVerifyWorkspace* ws = impl.ws;
    std::vector<cudaGraphExec_t> execs(sets);
    for (int s = 0; s < sets; ++s) {
      cudaGraph_t g;
      CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      const cudaError_t launch =
          probesidecar::kernels::LaunchMlaVerifyPath(params[s], path, ws, stream);
      CHECK_CUDA(cudaStreamEndCapture(stream, &g));
      CHECK_CUDA(launch);
      CHECK_CUDA(cudaGraphInstantiate(&execs[s], g, 0));
      CHECK_CUDA(cudaGraphDestroy(g));
    }
    // Warm-up, and an estimate of one run's time.
    CHECK_CUDA(cudaEventRecord(e0, stream));
    for (int i = 0; i < 3; ++i) CHECK_CUDA(cudaGraphLaunch(execs[i % sets], stream));
    CHECK_CUDA(cudaEventRecord(e1, stream));
    CHECK_CUDA(cudaEventSynchronize(e1));
    float est_ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&est_ms, e0, e1));
    est_ms /= 3;
    const int reps = std::clamp(static_cast<int>(60.0 / std::max(est_ms, 1e-3f)), 10, 200);
    std::vector<double> times;
    for (int i = 0; i < reps; ++i) {
      CHECK_CUDA(cudaEventRecord(e0, stream));
      CHECK_CUDA(cudaGraphLaunch(execs[i % sets], stream));
      CHECK_CUDA(cudaEventRecord(e1, stream));
      CHECK_CUDA(cudaEventSynchronize(e1));
      float t = 0;
      CHECK_CUDA(cudaEventElapsedTime(&t, e0, e1));
      times.push_back(t * 1e3);
    }
    std::vector<double> eager;
    for (int i = 0; i < std::min(reps, 20); ++i) {
      CHECK_CUDA(cudaEventRecord(e0, stream));
      CHECK_CUDA(probesidecar::kernels::LaunchMlaVerifyPath(params[i % sets], path, ws, stream));
      CHECK_CUDA(cudaEventRecord(e1, stream));
      CHECK_CUDA(cudaEventSynchronize(e1));
      float t = 0;
      CHECK_CUDA(cudaEventElapsedTime(&t, e0, e1));
      eager.push_back(t * 1e3);
    }
    for (cudaGraphExec_t e : execs) CHECK_CUDA(cudaGraphExecDestroy(e));
    if (path == MlaVerifyPath::kSplitKvSm90a && trace.Wants(pt) &&
        !TraceOnce(pt, params[0], impl, trace, stream)) {
      return false;
    }
    Record r;
    r.pt = pt;
    r.impl = impl.name;
    if (path != MlaVerifyPath::kSplitKvSm90a) {
      r.tile = probesidecar::kernels::MlaVerifyTileName(
          probesidecar::kernels::ChooseMlaVerifyTile(*ws, pt.s_q * pt.h_q));
    } else {  // the schedule the plan takes
      r.tile = probesidecar::kernels::MlaVerifySm90aScheduleName(
          probesidecar::kernels::ChooseMlaVerifySm90aSchedule(*ws, pt.s_q * pt.h_q, pt.batch));
    }
    r.dispatched = ws == dispatch_ws &&
                   path == probesidecar::kernels::ChooseMlaVerifyPath(*ws, pt.s_q * pt.h_q);
    r.graph_us = Median(times);
    r.eager_us = Median(eager);
    r.gbps = BytesOf(pt) / (r.graph_us * 1e-6) / 1e9;
    r.tflops = FlopsOf(pt) / (r.graph_us * 1e-6) / 1e12;
    records->push_back(r);
  }
  CHECK_CUDA(cudaEventDestroy(e0));
  CHECK_CUDA(cudaEventDestroy(e1));
  return true;
}

// value / ceiling with 4 decimals, or null when the ceiling was not measured (--skip-ceilings).
std::string Fraction(double value, double ceiling) {
  if (!(ceiling > 0)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.4f", value / ceiling);
  return buf;
}

std::string JsonEscape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_path, git, sweep = "full", points_arg, family_arg,
                             impls_arg = "split_kv,split_kv_sm90a,baseline";
  bool allow_dirty = false, skip_ceilings = false;
  std::string trace_dir, trace_points;
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--out")
      out_path = next();
    else if (a == "--git")
      git = next();
    else if (a == "--allow-dirty")
      allow_dirty = true;
    else if (a == "--sweep")
      sweep = next();
    else if (a == "--impls")
      impls_arg = next();
    else if (a == "--points")
      points_arg = next();
    else if (a == "--skip-ceilings")
      skip_ceilings = true;  // profiling runs
    else if (a == "--trace-dir")
      trace_dir = next();
    else if (a == "--trace-points")
      trace_points = next();
    // Tiles as on a GPU of another family (its shared-memory limits; no sm_90a path off sm_90).
    else if (a == "--family")
      family_arg = next();
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  git = probesidecar::bench::ResultIdentity(git);
  const std::string why = probesidecar::bench::CheckResultIdentity(git, allow_dirty);
  if (!why.empty()) {
    std::fprintf(stderr, "mla-verify-bench: %s\n", why.c_str());
    return 2;
  }
  const probesidecar::kernels::DeviceFamily* family = nullptr;
  if (!family_arg.empty() &&
      (family = probesidecar::kernels::FindDeviceFamily(family_arg)) == nullptr) {
    std::fprintf(stderr, "mla-verify-bench: --family %s is no family of kDeviceFamilies\n",
                 family_arg.c_str());
    return 2;
  }
  const std::string wanted = "," + impls_arg + ",";
  auto want = [&](const std::string& name) {
    return wanted.find("," + name + ",") != std::string::npos;
  };

  auto run = [&]() -> bool {
    cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    Ceilings ceil;
    if (!skip_ceilings && !MeasureCeilings(&ceil)) return false;
    std::printf("device %s: copy %.0f GB/s, bf16 GEMM %.0f TFLOP/s\n", prop.name, ceil.copy_gbps,
                ceil.bf16_tflops);
    std::vector<Point> points;
    if (sweep == "targets") {
      for (int s : {1, 2, 4})
        for (auto [b, l] : {std::pair{64, 4096}, {64, 16384}, {128, 4096}, {128, 65536}})
          points.push_back({16, s, b, l});
      for (int s : {1, 2, 4, 8}) points.push_back({128, s, 64, 16384});
      for (int s : {1, 2, 4, 8}) points.push_back({16, s, 1, 65536});
      points.push_back({16, 1, 128, 1024});
      points.push_back({16, 8, 64, 4096});
      points.push_back({128, 1, 8, 1024});
      points.push_back({128, 8, 1, 1024});
    } else {
      const std::vector<int> sqs =
          sweep == "quick" ? std::vector<int>{1, 4} : std::vector<int>{1, 2, 4, 8};
      const std::vector<int> batches =
          sweep == "quick" ? std::vector<int>{1, 64} : std::vector<int>{1, 8, 64, 128};
      const std::vector<int> lens = sweep == "quick" ? std::vector<int>{4096, 65536}
                                                     : std::vector<int>{1024, 4096, 16384, 65536};
      for (int h : {16, 128})
        for (int s : sqs)
          for (int b : batches)
            for (int l : lens) points.push_back({h, s, b, l});
    }
    if (!points_arg.empty()) {
      std::vector<Point> only;
      const std::string list = "," + points_arg + ",";
      for (const Point& pt : points) {
        const std::string key = "," + std::to_string(pt.h_q) + ":" + std::to_string(pt.s_q) + ":" +
                                std::to_string(pt.batch) + ":" + std::to_string(pt.len) + ",";
        if (list.find(key) != std::string::npos) only.push_back(pt);
      }
      points = only;
    }
    // Pools: 11 GB of pages (the largest point, 128 x 64k, is 9.7 GB), q / out for 8 sets.
    Pools pools;
    pools.kv_pages = static_cast<size_t>(11e9 / (64 * 576 * 2));
    pools.q_elems = size_t{200} << 20;  // 400 MB
    pools.out_elems = size_t{200} << 20;
    pools.table_ints = pools.kv_pages;
    CHECK_CUDA(cudaMalloc(&pools.kv, pools.kv_pages * 64 * 576 * 2));
    CHECK_CUDA(cudaMalloc(&pools.q, pools.q_elems * 2));
    CHECK_CUDA(cudaMalloc(&pools.out, pools.out_elems * 2));
    CHECK_CUDA(cudaMalloc(&pools.tables, pools.table_ints * 4));
    CHECK_CUDA(cudaMalloc(&pools.lens, 256 * 4));
    FillRandomBf16<<<4096, 256>>>(pools.kv, pools.kv_pages * 64 * 576, 11, 1.0f);
    FillRandomBf16<<<4096, 256>>>(pools.q, pools.q_elems, 12, 2.0f);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaDeviceSynchronize());
    using probesidecar::kernels::MlaVerifySm90aSchedule;
    std::vector<MlaVerifyWorkspace*> workspaces;
    auto make_ws = [&](MlaVerifySm90aSchedule schedule, MlaVerifyWorkspace** out) -> bool {
      probesidecar::kernels::MlaVerifyWorkspaceConfig ws_config;
      ws_config.limit_to_family = family;
      ws_config.sm90a_schedule = schedule;
      CHECK_CUDA(probesidecar::kernels::CreateMlaVerifyWorkspace(ws_config, out));
      workspaces.push_back(*out);
      return true;
    };
    MlaVerifyWorkspace* ws = nullptr;
    if (!make_ws(MlaVerifySm90aSchedule::kAuto, &ws)) return false;
    std::printf("sm_90a path: %s; tiles as on %s; trace %s\n", ws->has_sm90a ? "yes" : "no",
                family != nullptr ? family->name : "this device",
                probesidecar::kernels::MlaVerifyTraceCompiledIn() ? "compiled in" : "absent");
    std::vector<Impl> impls;
    if (want("split_kv")) impls.push_back({MlaVerifyPath::kSplitKv, ws, "split_kv"});
    if (want("split_kv_sm90a") && ws->has_sm90a)
      impls.push_back({MlaVerifyPath::kSplitKvSm90a, ws, "split_kv_sm90a"});
    struct Forced {
      const char* name;
      MlaVerifySm90aSchedule schedule;
    };
    for (const Forced& f : {Forced{"split_kv_sm90a_pairs", MlaVerifySm90aSchedule::kPagePairs},
                            Forced{"split_kv_sm90a_one_page", MlaVerifySm90aSchedule::kOnePage},
                            Forced{"split_kv_sm90a_swap_ab", MlaVerifySm90aSchedule::kSwapAb}}) {
      if (!want(f.name) || !ws->has_sm90a) continue;
      MlaVerifyWorkspace* forced = nullptr;
      if (!make_ws(f.schedule, &forced)) return false;
      impls.push_back({MlaVerifyPath::kSplitKvSm90a, forced, f.name});
    }
    if (want("baseline")) impls.push_back({MlaVerifyPath::kBaseline, ws, "baseline"});
    Trace trace;
    if (!trace_dir.empty()) {
      if (!probesidecar::kernels::MlaVerifyTraceCompiledIn()) {
        std::fprintf(stderr,
                     "--trace-dir: this build has no trace (-DPROBESIDECAR_MLA_TRACE=ON)\n");
        return false;
      }
      trace.dir = trace_dir;
      trace.points = trace_points.empty() ? "" : "," + trace_points + ",";
      trace.max_blocks = 2 * ws->num_sms;
      trace.events = 1 << 14;
      CHECK_CUDA(cudaDeviceGetAttribute(&trace.clock_khz, cudaDevAttrClockRate, 0));
      CHECK_CUDA(cudaMalloc(&trace.buffer,
                            static_cast<size_t>(trace.max_blocks) * 2 * trace.events * 2 * 4));
    }
    cudaStream_t stream;
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    std::vector<Record> records;
    std::vector<std::string> skipped;
    for (const Point& pt : points) {
      if (!Fits(pt, pools)) {
        skipped.push_back("h_q=" + std::to_string(pt.h_q) + " s_q=" + std::to_string(pt.s_q) +
                          " batch=" + std::to_string(pt.batch) + " len=" + std::to_string(pt.len));
        continue;
      }
      const size_t before = records.size();
      if (!RunPoint(pt, pools, ws, stream, impls, trace, &records)) return false;
      for (size_t i = before; i < records.size(); ++i) {
        const Record& r = records[i];
        std::printf(
            "h_q=%3d s_q=%d batch=%3d len=%6d %-27s %-10s graph %9.1f us eager %9.1f us  %6.0f "
            "GB/s "
            "(%.2f)  %5.0f TFLOP/s (%.2f)\n",
            pt.h_q, pt.s_q, pt.batch, pt.len, r.impl.c_str(), r.tile.c_str(), r.graph_us,
            r.eager_us, r.gbps, r.gbps / ceil.copy_gbps, r.tflops, r.tflops / ceil.bf16_tflops);
      }
      std::fflush(stdout);
    }
    for (MlaVerifyWorkspace* w : workspaces) probesidecar::kernels::DestroyMlaVerifyWorkspace(w);
    if (trace.buffer != nullptr) CHECK_CUDA(cudaFree(trace.buffer));
    FILE* f = std::fopen(out_path.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "cannot write %s\n", out_path.c_str());
      return false;
    }
    char date[64];
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    std::fprintf(f, "{\n  \"device\": \"%s\",\n  \"git\": \"%s\",\n  \"date\": \"%s\",\n",
                 JsonEscape(prop.name).c_str(), git.c_str(), date);
    std::fprintf(f, "  \"command\": \"%s\",\n", JsonEscape(command).c_str());
    std::fprintf(f, "  \"limit_to_family\": %s%s%s,\n", family ? "\"" : "",
                 family ? family->name : "null", family ? "\"" : "");
    std::fprintf(f, "  \"ceilings\": {\"copy_gbps\": %.1f, \"bf16_tflops\": %.1f},\n",
                 ceil.copy_gbps, ceil.bf16_tflops);
    std::fprintf(f, "  \"skipped\": [");
    for (size_t i = 0; i < skipped.size(); ++i)
      std::fprintf(f, "%s\"%s (inputs do not fit the benchmark's pools)\"", i ? ", " : "",
                   skipped[i].c_str());
    std::fprintf(f, "],\n  \"records\": [\n");
    for (size_t i = 0; i < records.size(); ++i) {
      const Record& r = records[i];
      std::fprintf(
          f,
          "    {\"bench\": \"mla_verify\", \"impl\": \"%s\", \"tile\": \"%s\", \"dispatched\": %s, "
          "\"dtype\": \"bf16\", "
          "\"shape\": {\"batch\": %d, \"s_q\": %d, \"h_q\": %d, \"seqlen\": %d, "
          "\"page_size\": 64}, \"graph_us_p50\": %.2f, \"eager_us_p50\": %.2f, "
          "\"gbps\": %.1f, \"tflops\": %.1f, \"frac_copy\": %s, \"frac_tflops\": %s}%s\n",
          r.impl.c_str(), r.tile.c_str(), r.dispatched ? "true" : "false", r.pt.batch, r.pt.s_q,
          r.pt.h_q, r.pt.len, r.graph_us, r.eager_us, r.gbps, r.tflops,
          Fraction(r.gbps, ceil.copy_gbps).c_str(), Fraction(r.tflops, ceil.bf16_tflops).c_str(),
          i + 1 < records.size() ? "," : "");
    }
    std::fprintf(f, "  ]\n}\n");
    std::fclose(f);
    return true;
  };
  return run() ? 0 : 1;
}
