// GPU tests of MLA verify: every path against a float64 reference on fresh random q and cache
// (never zeros) with NaN in every cache row past each sequence's end, in unused pages and in the
// table slots past each request's pages; NaN-poisoned outputs (every element must be written,
// and padding between strided output rows must stay untouched); shuffled page tables; variable
// lengths; s_q 1..16; h_q 16..128; lengths below one page, on page boundaries and past 64k;
// graph replay bit for bit equal to eager; split_kv and baseline within the bound of each other;
// plans refused where they do not match. Every path runs through LaunchMlaVerifyPath (the
// dispatcher's entry) with the path forced, so each kernel and tile size is checked wherever
// the device has it; split_kv_sm90a runs with the plan's schedule and with each schedule forced
// (workspaces made for that), at every row count.
//
// The float64 reference runs on the GPU (one block per query row, double arithmetic) so that
// long sequences and 128 heads stay quick; the first test checks it against the CPU reference.
//
// Without a CUDA device of compute capability 9.x or later the binary prints "SKIPPED: ..." and
// exits 77, which CTest reports as skipped.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/dtype.h"
#include "kernels/blocks/device_support.h"
#include "kernels/blocks/gpu_test_main.h"
#include "kernels/mla_verify/mla_verify.h"
#include "kernels/mla_verify/mla_verify_plan.h"
#include "kernels/mla_verify/mla_verify_ref.h"

namespace probesidecar::kernels {
namespace {

// The family the tile choice is confined to (PROBE_SIDECAR_LIMIT_TO_FAMILY, read by main), or
// nullptr: the device's own limits.
const DeviceFamily* g_family = nullptr;

#define CUDA_ASSERT(expr)                                                      \
  do {                                                                         \
    const cudaError_t err_ = (expr);                                           \
    ASSERT_EQ(err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(err_); \
  } while (0)

constexpr int kDqk = 576, kDv = 512, kPage = 64;
constexpr uint16_t kNanBf16 = 0x7fc1;        // a quiet NaN no kernel produces
constexpr uint16_t kPoisonOut = 0x7fd3;      // poisoned output elements
constexpr uint32_t kPoisonLse = 0x7fc0dead;  // poisoned lse elements

uint64_t FreshSeed() {
  static uint64_t counter = 0;
  return static_cast<uint64_t>(
             std::chrono::high_resolution_clock::now().time_since_epoch().count()) ^
         (0x9e3779b97f4a7c15ull * ++counter);
}

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
// Uniform in (-1, 1), never exactly zero, as bf16 bits.
uint16_t RandBf16(uint64_t seed, uint64_t i, float amp) {
  const double u =
      ((Mix(seed ^ (i * 0x2545f4914f6cdd1dull)) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
  return common::FloatToBf16(static_cast<float>((2.0 * u - 1.0) * amp));
}

// ---------------------------------------------------------------------------------------------
// float64 reference on the GPU. Grid: (rows = s_q * h_q, batch); block: 256 threads.

__device__ double BlockReduce(double v, bool is_max, double* sm) {
  for (int d = 16; d > 0; d >>= 1) {
    const double o = __shfl_xor_sync(0xffffffffu, v, d);
    v = is_max ? fmax(v, o) : v + o;
  }
  if ((threadIdx.x & 31) == 0) sm[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    double w = threadIdx.x < (blockDim.x >> 5) ? sm[threadIdx.x] : (is_max ? -INFINITY : 0.0);
    for (int d = 16; d > 0; d >>= 1) {
      const double o = __shfl_xor_sync(0xffffffffu, w, d);
      w = is_max ? fmax(w, o) : w + o;
    }
    if (threadIdx.x == 0) sm[32] = w;
  }
  __syncthreads();
  const double r = sm[32];
  __syncthreads();
  return r;
}

__global__ void RefKernel(MlaVerifyParams p, int64_t scratch_stride, double* scratch, double* out,
                          double* absw, double* lse) {
  __shared__ double qd[kDqk];
  __shared__ double sm[33];
  const int32_t r = blockIdx.y, g = blockIdx.x;
  const int32_t j = g / p.h_q, h = g % p.h_q;
  const int32_t len = p.cache_seqlens[r];
  const int64_t visible = static_cast<int64_t>(len) - p.s_q + j + 1;
  const __nv_bfloat16* qp = p.q + r * p.q_batch_stride + j * p.q_token_stride + h * p.q_head_stride;
  for (int d = threadIdx.x; d < kDqk; d += blockDim.x) qd[d] = __bfloat162float(qp[d]);
  __syncthreads();
  double* s = scratch + (static_cast<int64_t>(r) * gridDim.x + g) * scratch_stride;
  const int32_t* table = p.block_table + r * p.block_table_batch_stride;
  auto key = [&](int64_t k) {
    return p.kv_cache + static_cast<int64_t>(table[k / kPage]) * p.kv_page_stride +
           (k % kPage) * p.kv_row_stride;
  };
  double mx = -INFINITY;
  for (int64_t k = threadIdx.x; k < visible; k += blockDim.x) {
    const __nv_bfloat16* kp = key(k);
    double dot = 0.0;
    for (int d = 0; d < kDqk; ++d) dot += qd[d] * static_cast<double>(__bfloat162float(kp[d]));
    s[k] = dot * static_cast<double>(p.softmax_scale);
    mx = fmax(mx, s[k]);
  }
  mx = BlockReduce(mx, true, sm);
  double sum = 0.0;
  for (int64_t k = threadIdx.x; k < visible; k += blockDim.x) sum += (s[k] = exp(s[k] - mx));
  sum = BlockReduce(sum, false, sm);  // also orders the s[] writes before the reads below
  const int64_t row = (static_cast<int64_t>(r) * p.s_q + j) * p.h_q + h;
  for (int d = threadIdx.x; d < kDv; d += blockDim.x) {
    double acc = 0.0, acc_abs = 0.0;
    for (int64_t k = 0; k < visible; ++k) {
      const double v = __bfloat162float(key(k)[d]);
      acc += s[k] * v;
      acc_abs += s[k] * fabs(v);
    }
    out[row * kDv + d] = visible > 0 ? acc / sum : 0.0;
    absw[row * kDv + d] = visible > 0 ? acc_abs / sum : 0.0;
  }
  if (threadIdx.x == 0) {
    lse[(static_cast<int64_t>(r) * p.h_q + h) * p.s_q + j] =
        visible > 0 ? mx + log(sum) : -INFINITY;
  }
}

// ---------------------------------------------------------------------------------------------
// One problem on the device.

template <typename T>
struct DevBuf {
  T* ptr = nullptr;
  size_t n = 0;
  cudaError_t Alloc(size_t count) {
    n = count;
    return cudaMalloc(&ptr, std::max<size_t>(count, 1) * sizeof(T));
  }
  ~DevBuf() { cudaFree(ptr); }
};

struct Shape {
  int32_t s_q = 1, h_q = 16;
  std::vector<int32_t> lens;
  int64_t q_head_stride = kDqk;   // > 576: q is a strided view
  int64_t q_token_pad = 0;        // elements between one token's last head and the next token
  int64_t out_head_stride = kDv;  // > 512: out is a strided view (padding must stay poisoned)
  int64_t kv_row_stride = kDqk;
  int64_t lse_head_pad = 0;
};

struct Problem {
  Shape shape;
  int32_t batch = 0, max_pages = 0, num_pages = 0;
  uint64_t seed = 0;
  std::vector<uint16_t> out_host;  // bf16 bits of the full (strided) out buffer
  std::vector<float> lse_host;
  DevBuf<__nv_bfloat16> q, kv, out;
  DevBuf<int32_t> table, lens;
  DevBuf<float> lse;
  MlaVerifyParams params;
};

// Builds random q and cache, NaN-poisoned beyond every sequence and in unused pages, a shuffled
// page table whose slots past each request's pages point at a NaN page.
void Build(const Shape& shape, Problem* pr) {
  pr->shape = shape;
  pr->seed = FreshSeed();
  pr->batch = static_cast<int32_t>(shape.lens.size());
  const uint64_t seed = pr->seed;
  int32_t used = 0;
  pr->max_pages = 0;
  for (int32_t len : shape.lens) {
    used += (len + kPage - 1) / kPage;
    pr->max_pages = std::max(pr->max_pages, (len + kPage - 1) / kPage);
  }
  pr->max_pages += 2;
  pr->num_pages = used + 4;
  std::mt19937_64 rng(seed);
  std::vector<int32_t> perm(pr->num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  const int64_t page_stride = kPage * shape.kv_row_stride;
  std::vector<uint16_t> kv(static_cast<size_t>(pr->num_pages) * page_stride, kNanBf16);
  const int32_t nan_page = perm[pr->num_pages - 1];
  std::vector<int32_t> table(static_cast<size_t>(pr->batch) * pr->max_pages, nan_page);
  int32_t next = 0;
  for (int32_t b = 0; b < pr->batch; ++b) {
    const int32_t len = shape.lens[b];
    for (int32_t pg = 0; pg * kPage < len; ++pg) {
      const int32_t page = perm[next++];
      table[static_cast<size_t>(b) * pr->max_pages + pg] = page;
      const int32_t rows = std::min(kPage, len - pg * kPage);
      for (int32_t t = 0; t < rows; ++t) {
        const int64_t base = page * page_stride + t * shape.kv_row_stride;
        for (int d = 0; d < kDqk; ++d) kv[base + d] = RandBf16(seed, base + d, 1.0f);
      }
    }
  }
  const int64_t token_stride = shape.h_q * shape.q_head_stride + shape.q_token_pad;
  std::vector<uint16_t> q(static_cast<size_t>(pr->batch) * shape.s_q * token_stride, kNanBf16);
  for (int64_t tok = 0; tok < static_cast<int64_t>(pr->batch) * shape.s_q; ++tok)
    for (int32_t h = 0; h < shape.h_q; ++h)
      for (int d = 0; d < kDqk; ++d)
        q[tok * token_stride + h * shape.q_head_stride + d] =
            RandBf16(seed + 1, (tok * shape.h_q + h) * kDqk + d, 2.0f);
  const int64_t out_token_stride = shape.h_q * shape.out_head_stride;
  const size_t out_n = static_cast<size_t>(pr->batch) * shape.s_q * out_token_stride;
  const int64_t lse_head_stride = shape.s_q + shape.lse_head_pad;
  const size_t lse_n = static_cast<size_t>(pr->batch) * shape.h_q * lse_head_stride;

  MlaVerifyParams& p = pr->params;
  ASSERT_EQ(pr->q.Alloc(q.size()), cudaSuccess);
  ASSERT_EQ(pr->kv.Alloc(kv.size()), cudaSuccess);
  ASSERT_EQ(pr->out.Alloc(out_n), cudaSuccess);
  ASSERT_EQ(pr->table.Alloc(table.size()), cudaSuccess);
  ASSERT_EQ(pr->lens.Alloc(pr->batch), cudaSuccess);
  ASSERT_EQ(pr->lse.Alloc(lse_n), cudaSuccess);
  CUDA_ASSERT(cudaMemcpy(pr->q.ptr, q.data(), q.size() * 2, cudaMemcpyHostToDevice));
  CUDA_ASSERT(cudaMemcpy(pr->kv.ptr, kv.data(), kv.size() * 2, cudaMemcpyHostToDevice));
  CUDA_ASSERT(cudaMemcpy(pr->table.ptr, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  CUDA_ASSERT(cudaMemcpy(pr->lens.ptr, shape.lens.data(), pr->batch * 4, cudaMemcpyHostToDevice));
  p.batch = pr->batch;
  p.s_q = shape.s_q;
  p.h_q = shape.h_q;
  p.softmax_scale = static_cast<float>(1.0 / std::sqrt(192.0));  // DeepSeek-V3's scale
  p.q = pr->q.ptr;
  p.q_head_stride = shape.q_head_stride;
  p.q_token_stride = token_stride;
  p.q_batch_stride = shape.s_q * token_stride;
  p.kv_cache = pr->kv.ptr;
  p.kv_row_stride = shape.kv_row_stride;
  p.kv_page_stride = page_stride;
  p.num_pages = pr->num_pages;
  p.block_table = pr->table.ptr;
  p.block_table_batch_stride = pr->max_pages;
  p.max_pages = pr->max_pages;
  p.cache_seqlens = pr->lens.ptr;
  p.out = pr->out.ptr;
  p.out_head_stride = shape.out_head_stride;
  p.out_token_stride = out_token_stride;
  p.out_batch_stride = shape.s_q * out_token_stride;
  p.lse = pr->lse.ptr;
  p.lse_head_stride = lse_head_stride;
  p.lse_batch_stride = shape.h_q * lse_head_stride;
}

void Poison(Problem* pr) {
  std::vector<uint16_t> o(pr->out.n, kPoisonOut);
  CUDA_ASSERT(cudaMemcpy(pr->out.ptr, o.data(), o.size() * 2, cudaMemcpyHostToDevice));
  std::vector<uint32_t> l(pr->lse.n, kPoisonLse);
  CUDA_ASSERT(cudaMemcpy(pr->lse.ptr, l.data(), l.size() * 4, cudaMemcpyHostToDevice));
}

void Fetch(Problem* pr) {
  pr->out_host.resize(pr->out.n);
  pr->lse_host.resize(pr->lse.n);
  CUDA_ASSERT(cudaMemcpy(pr->out_host.data(), pr->out.ptr, pr->out.n * 2, cudaMemcpyDeviceToHost));
  CUDA_ASSERT(cudaMemcpy(pr->lse_host.data(), pr->lse.ptr, pr->lse.n * 4, cudaMemcpyDeviceToHost));
}

// Dense [b, s_q, h_q, 512] floats and [b, h_q, s_q] lse out of the strided buffers; checks that
// the padding between strided rows still holds the poison.
void Densify(const Problem& pr, std::vector<float>* out, std::vector<float>* lse) {
  const Shape& s = pr.shape;
  const size_t rows = static_cast<size_t>(pr.batch) * s.s_q * s.h_q;
  out->resize(rows * kDv);
  for (size_t row = 0; row < rows; ++row) {
    for (int d = 0; d < kDv; ++d)
      (*out)[row * kDv + d] = common::Bf16ToFloat(pr.out_host[row * s.out_head_stride + d]);
    for (int64_t d = kDv; d < s.out_head_stride; ++d)
      ASSERT_EQ(pr.out_host[row * s.out_head_stride + d], kPoisonOut) << "padding overwritten";
  }
  lse->resize(rows);
  const int64_t lhs = s.s_q + s.lse_head_pad;
  for (int32_t b = 0; b < pr.batch; ++b)
    for (int32_t h = 0; h < s.h_q; ++h)
      for (int32_t j = 0; j < lhs; ++j) {
        const float v = pr.lse_host[(static_cast<size_t>(b) * s.h_q + h) * lhs + j];
        if (j < s.s_q) {
          (*lse)[(static_cast<size_t>(b) * s.h_q + h) * s.s_q + j] = v;
        } else {
          uint32_t bits;
          std::memcpy(&bits, &v, 4);
          ASSERT_EQ(bits, kPoisonLse) << "lse padding overwritten";
        }
      }
}

struct Reference {
  std::vector<double> out, absw, lse;
};

void GpuReference(const Problem& pr, Reference* ref) {
  const Shape& s = pr.shape;
  const int32_t rows = s.s_q * s.h_q;
  int64_t max_len = 1;
  for (int32_t l : s.lens) max_len = std::max<int64_t>(max_len, l);
  const size_t n_rows = static_cast<size_t>(pr.batch) * rows;
  DevBuf<double> scratch, out, absw, lse;
  ASSERT_EQ(scratch.Alloc(n_rows * max_len), cudaSuccess);
  ASSERT_EQ(out.Alloc(n_rows * kDv), cudaSuccess);
  ASSERT_EQ(absw.Alloc(n_rows * kDv), cudaSuccess);
  ASSERT_EQ(lse.Alloc(n_rows), cudaSuccess);
  RefKernel<<<dim3(rows, pr.batch), 256>>>(pr.params, max_len, scratch.ptr, out.ptr, absw.ptr,
                                           lse.ptr);
  CUDA_ASSERT(cudaGetLastError());
  CUDA_ASSERT(cudaDeviceSynchronize());
  ref->out.resize(n_rows * kDv);
  ref->absw.resize(n_rows * kDv);
  ref->lse.resize(n_rows);
  CUDA_ASSERT(cudaMemcpy(ref->out.data(), out.ptr, n_rows * kDv * 8, cudaMemcpyDeviceToHost));
  CUDA_ASSERT(cudaMemcpy(ref->absw.data(), absw.ptr, n_rows * kDv * 8, cudaMemcpyDeviceToHost));
  CUDA_ASSERT(cudaMemcpy(ref->lse.data(), lse.ptr, n_rows * 8, cudaMemcpyDeviceToHost));
}

// A path on a workspace: the split_kv_sm90a schedules are told apart by the workspace.
struct Variant {
  MlaVerifyPath path;
  MlaVerifyWorkspace* ws;
  std::string name;
};

class MlaVerifyGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MlaVerifyWorkspaceConfig config;
    config.limit_to_family = g_family;
    ASSERT_EQ(CreateMlaVerifyWorkspace(config, &ws_), cudaSuccess);
    config.sm90a_schedule = MlaVerifySm90aSchedule::kPagePairs;
    ASSERT_EQ(CreateMlaVerifyWorkspace(config, &ws_pairs_), cudaSuccess);
    config.sm90a_schedule = MlaVerifySm90aSchedule::kOnePage;
    ASSERT_EQ(CreateMlaVerifyWorkspace(config, &ws_one_page_), cudaSuccess);
    config.sm90a_schedule = MlaVerifySm90aSchedule::kSwapAb;
    ASSERT_EQ(CreateMlaVerifyWorkspace(config, &ws_swap_ab_), cudaSuccess);
    CUDA_ASSERT(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    DestroyMlaVerifyWorkspace(ws_);
    DestroyMlaVerifyWorkspace(ws_pairs_);
    DestroyMlaVerifyWorkspace(ws_one_page_);
    DestroyMlaVerifyWorkspace(ws_swap_ab_);
    cudaStreamDestroy(stream_);
  }

  // Runs a variant on a poisoned output and compares every element with the reference.
  void RunAndCheck(Problem* pr, const Variant& v, const Reference& ref, const char* what) {
    Poison(pr);
    CUDA_ASSERT(LaunchMlaVerifyPath(pr->params, v.path, v.ws, stream_));
    CUDA_ASSERT(cudaStreamSynchronize(stream_));
    Fetch(pr);
    std::vector<float> out, lse;
    Densify(*pr, &out, &lse);
    const MlaCompareResult r =
        CompareMlaOutput(out.data(), ref.out.data(), ref.absw.data(), out.size());
    const MlaCompareResult rl = CompareMlaLse(lse.data(), ref.lse.data(), lse.size());
    char line[400];
    std::snprintf(line, sizeof(line),
                  "[worst] %-25s %-30s out: max_abs %.3g err/bound %.3f rel_l2 %.3g bad %lld "
                  "nan %lld | lse: max_abs %.3g bad %lld",
                  v.name.c_str(), what, r.max_abs_err, r.max_err_over_bound, r.rel_l2,
                  static_cast<long long>(r.bad), static_cast<long long>(r.nan), rl.max_abs_err,
                  static_cast<long long>(rl.bad));
    std::printf("%s\n", line);
    EXPECT_TRUE(r.ok()) << line << " worst index " << r.worst_index << " got "
                        << (r.worst_index >= 0 ? out[r.worst_index] : 0.f) << " ref "
                        << (r.worst_index >= 0 ? ref.out[r.worst_index] : 0.0) << " seed "
                        << pr->seed;
    EXPECT_LT(r.rel_l2, 4e-3) << line;
    EXPECT_TRUE(rl.ok()) << line << " worst index " << rl.worst_index << " seed " << pr->seed;
  }

  void CheckShape(const Shape& shape, const std::string& what) {
    Problem pr;
    Build(shape, &pr);
    if (HasFatalFailure()) return;
    Reference ref;
    GpuReference(pr, &ref);
    if (HasFatalFailure()) return;
    for (const Variant& v : Variants()) {
      RunAndCheck(&pr, v, ref, what.c_str());
      if (HasFatalFailure()) return;
    }
  }

  // Every path this device runs: split_kv, baseline (second), and where it exists split_kv_sm90a
  // with the plan's schedule and with each schedule forced.
  std::vector<Variant> Variants() const {
    std::vector<Variant> v = {{MlaVerifyPath::kSplitKv, ws_, "split_kv"},
                              {MlaVerifyPath::kBaseline, ws_, "baseline"}};
    if (ws_->has_sm90a) {
      v.push_back({MlaVerifyPath::kSplitKvSm90a, ws_, "split_kv_sm90a"});
      v.push_back({MlaVerifyPath::kSplitKvSm90a, ws_pairs_, "split_kv_sm90a/page_pairs"});
      v.push_back({MlaVerifyPath::kSplitKvSm90a, ws_one_page_, "split_kv_sm90a/one_page"});
      v.push_back({MlaVerifyPath::kSplitKvSm90a, ws_swap_ab_, "split_kv_sm90a/swap_ab"});
    }
    return v;
  }

  void GraphReplayCase(int32_t s_q);

  MlaVerifyWorkspace* ws_ = nullptr;
  MlaVerifyWorkspace* ws_pairs_ = nullptr;     // split_kv_sm90a forced to page pairs
  MlaVerifyWorkspace* ws_one_page_ = nullptr;  // split_kv_sm90a forced to one page
  MlaVerifyWorkspace* ws_swap_ab_ = nullptr;   // split_kv_sm90a forced to swap-AB (<= 32 rows)
  cudaStream_t stream_ = nullptr;
};

TEST_F(MlaVerifyGpuTest, GpuReferenceMatchesCpuReference) {
  Shape shape;
  shape.s_q = 3;
  shape.h_q = 32;
  shape.lens = {5, 64, 150, 2};  // 2 < s_q: the first query sees no key
  shape.q_head_stride = 584;
  Problem pr;
  Build(shape, &pr);
  Reference gpu;
  GpuReference(pr, &gpu);
  // Same inputs on the host.
  std::vector<uint16_t> q(pr.q.n), kv(pr.kv.n);
  std::vector<int32_t> table(pr.table.n);
  CUDA_ASSERT(cudaMemcpy(q.data(), pr.q.ptr, q.size() * 2, cudaMemcpyDeviceToHost));
  CUDA_ASSERT(cudaMemcpy(kv.data(), pr.kv.ptr, kv.size() * 2, cudaMemcpyDeviceToHost));
  CUDA_ASSERT(cudaMemcpy(table.data(), pr.table.ptr, table.size() * 4, cudaMemcpyDeviceToHost));
  MlaVerifyRefInputs in;
  in.batch = pr.batch;
  in.s_q = shape.s_q;
  in.h_q = shape.h_q;
  in.softmax_scale = pr.params.softmax_scale;
  in.q = q.data();
  in.q_batch_stride = pr.params.q_batch_stride;
  in.q_token_stride = pr.params.q_token_stride;
  in.q_head_stride = pr.params.q_head_stride;
  in.kv_cache = kv.data();
  in.kv_page_stride = pr.params.kv_page_stride;
  in.kv_row_stride = pr.params.kv_row_stride;
  in.block_table = table.data();
  in.block_table_batch_stride = pr.max_pages;
  in.cache_seqlens = shape.lens.data();
  MlaVerifyRefOutputs cpu;
  MlaVerifyReference(in, &cpu);
  for (size_t i = 0; i < cpu.out.size(); ++i) {
    ASSERT_NEAR(gpu.out[i], cpu.out[i], 1e-12) << i;
    ASSERT_NEAR(gpu.absw[i], cpu.abs_weighted[i], 1e-12) << i;
  }
  for (size_t i = 0; i < cpu.lse.size(); ++i) {
    if (std::isinf(cpu.lse[i])) {
      ASSERT_EQ(gpu.lse[i], cpu.lse[i]);
    } else {
      ASSERT_NEAR(gpu.lse[i], cpu.lse[i], 1e-12) << i;
    }
  }
  RunAndCheck(&pr, Variant{MlaVerifyPath::kSplitKv, ws_, "split_kv"}, gpu, "cpu-ref case");
  std::printf("sm_90a path %s\n", ws_->has_sm90a ? "present: tested beside the others"
                                                 : "absent on this device or build");
}

// The path and tile choice by the device and the build: split_kv_sm90a only on compute
// capability 9.0 with the sm_90a kernels built (not when confined to another family), and a
// portable tile that fits the device's blocks for every row count.
TEST_F(MlaVerifyGpuTest, DispatchFollowsTheDeviceAndBuild) {
  const DeviceLimits& l = ws_->limits;
  std::printf(
      "[dispatch] planned as compute capability %d.%d, %lld bytes of shared memory per "
      "block, %lld per SM; sm_90a kernels %s this build; split_kv_sm90a %s; tiles:",
      l.cc_major, l.cc_minor, static_cast<long long>(l.smem_per_block_optin),
      static_cast<long long>(l.smem_per_sm), Sm90aKernelsBuilt() ? "in" : "not in",
      ws_->has_sm90a ? "dispatched" : "absent");
  for (int32_t rows : {16, 32, 64, 128, 2048}) {
    const int32_t tile = ChooseMlaVerifyTile(*ws_, rows);
    std::printf(" %d rows %s", rows, MlaVerifyTileName(tile));
    ASSERT_GE(tile, 0);
    EXPECT_LE(mla::TileSmemBytes(mla::kTiles[tile].rows, mla::kTiles[tile].stages),
              l.smem_per_block_optin);
    EXPECT_EQ(ChooseMlaVerifyPath(*ws_, rows),
              ws_->has_sm90a ? MlaVerifyPath::kSplitKvSm90a : MlaVerifyPath::kSplitKv);
  }
  std::printf("\n");
  if (!Sm90aKernelsBuilt() || l.cc_major != 9 || l.cc_minor != 0 ||
      (g_family != nullptr && !g_family->sm90a)) {
    EXPECT_FALSE(ws_->has_sm90a);
  }
  if (g_family != nullptr) EXPECT_LE(l.smem_per_block_optin, g_family->limits.smem_per_block_optin);
  if (const int expected = gpu_test::ExpectedSm90a(); expected >= 0) {
    EXPECT_EQ(ws_->has_sm90a, expected == 1) << "PROBE_SIDECAR_EXPECT_SM90A=" << expected;
  }
}

// Every s_q x h_q with short, page-boundary and random lengths (variable within a batch).
TEST_F(MlaVerifyGpuTest, AllShapesShortAndBoundaryLengths) {
  std::mt19937_64 rng(FreshSeed());
  for (int32_t s_q : {1, 2, 3, 4, 8, 16}) {
    for (int32_t h_q : {16, 32, 64, 128}) {
      Shape shape;
      shape.s_q = s_q;
      shape.h_q = h_q;
      const int32_t lo = s_q;
      shape.lens = {
          lo, std::max(lo, 63), 64, 128, 65, 64 * 3 + 1, lo + static_cast<int32_t>(rng() % 3000)};
      if (h_q == 128 && s_q >= 8) shape.lens.resize(5);  // keep the reference quick
      CheckShape(shape, "s_q=" + std::to_string(s_q) + " h_q=" + std::to_string(h_q));
      if (HasFatalFailure()) return;
    }
  }
}

TEST_F(MlaVerifyGpuTest, StridedViewsAndEmptyRows) {
  Shape shape;
  shape.s_q = 4;
  shape.h_q = 16;
  shape.lens = {3, 70, 1, 4, 640, 0};  // 3, 1, 0 < s_q: rows with no key (out 0, lse -inf)
  shape.q_head_stride = 640;
  shape.q_token_pad = 8 * 7;
  shape.out_head_stride = 576;
  shape.kv_row_stride = 600;
  shape.lse_head_pad = 3;
  CheckShape(shape, "strided, L < s_q");
}

TEST_F(MlaVerifyGpuTest, LongSequencesPast64k) {
  Shape shape;
  shape.s_q = 2;
  shape.h_q = 16;
  shape.lens = {65536 + 37, 70000, 100, 131072};
  CheckShape(shape, "h16 s2 64k..128k");
  Shape wide;
  wide.s_q = 1;
  wide.h_q = 128;
  wide.lens = {65536 + 64};
  CheckShape(wide, "h128 s1 1 x 65600");
}

TEST_F(MlaVerifyGpuTest, LargeBatchManyRequestsPerBlock) {
  std::mt19937_64 rng(FreshSeed());
  Shape shape;
  shape.s_q = 2;
  shape.h_q = 16;
  shape.lens.resize(256);
  for (int32_t& l : shape.lens) l = 2 + static_cast<int32_t>(rng() % 1500);
  CheckShape(shape, "batch 256 mixed");
  Shape wide;
  wide.s_q = 4;
  wide.h_q = 64;
  wide.lens.resize(40);
  for (int32_t& l : wide.lens) l = 4 + static_cast<int32_t>(rng() % 5000);
  CheckShape(wide, "batch 40 h64 s4 mixed");
}

// Up to kBlockPlanMaxBatch requests the sm_90a kernels plan in block, beyond it the plan kernel
// plans: both sides of the boundary, with requests split over ranges.
TEST_F(MlaVerifyGpuTest, BlockPlanBoundary) {
  std::mt19937_64 rng(FreshSeed());
  for (const int32_t batch : {mla::kBlockPlanMaxBatch, mla::kBlockPlanMaxBatch + 1}) {
    Shape shape;
    shape.s_q = 2;
    shape.h_q = 16;
    shape.lens.resize(batch);
    for (int32_t& l : shape.lens) l = 2 + static_cast<int32_t>(rng() % 9000);
    CheckShape(shape, "batch " + std::to_string(batch));
    if (HasFatalFailure()) return;
  }
}

// Graph replay equals eager bit for bit, and a graph reads new lengths at replay time.
// At 64 rows and at 32 (where the plan takes swap-AB).
TEST_F(MlaVerifyGpuTest, GraphReplayEqualsEagerBitForBit) {
  for (const int32_t s_q : {4, 2}) {
    GraphReplayCase(s_q);
    if (HasFatalFailure()) return;
  }
}

void MlaVerifyGpuTest::GraphReplayCase(int32_t s_q) {
  Shape shape;
  shape.s_q = s_q;
  shape.h_q = 16;
  shape.lens = {300, 4096, 77, 1000, 64};
  Problem pr;
  Build(shape, &pr);
  pr.params.num_pages = 0;  // "not given": the TMA map's page bound falls back to a large one
  for (const Variant& v : Variants()) {
    SCOPED_TRACE(v.name + " s_q=" + std::to_string(s_q));
    Poison(&pr);
    CUDA_ASSERT(LaunchMlaVerifyPath(pr.params, v.path, v.ws, stream_));
    CUDA_ASSERT(cudaStreamSynchronize(stream_));
    Fetch(&pr);
    const std::vector<uint16_t> eager_out = pr.out_host;
    const std::vector<float> eager_lse = pr.lse_host;

    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    CUDA_ASSERT(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    const cudaError_t launch = LaunchMlaVerifyPath(pr.params, v.path, v.ws, stream_);
    CUDA_ASSERT(cudaStreamEndCapture(stream_, &graph));
    CUDA_ASSERT(launch);
    CUDA_ASSERT(cudaGraphInstantiate(&exec, graph, 0));
    for (int rep = 0; rep < 3; ++rep) {
      Poison(&pr);
      CUDA_ASSERT(cudaGraphLaunch(exec, stream_));
      CUDA_ASSERT(cudaStreamSynchronize(stream_));
      Fetch(&pr);
      ASSERT_EQ(0, std::memcmp(eager_out.data(), pr.out_host.data(), eager_out.size() * 2));
      ASSERT_EQ(0, std::memcmp(eager_lse.data(), pr.lse_host.data(), eager_lse.size() * 4));
    }
    // New lengths (within the same tables) read at replay: equal to an eager run on them.
    std::vector<int32_t> lens2 = {64, 4000, 5, 999, 4};
    CUDA_ASSERT(cudaMemcpy(pr.lens.ptr, lens2.data(), lens2.size() * 4, cudaMemcpyHostToDevice));
    Poison(&pr);
    CUDA_ASSERT(cudaGraphLaunch(exec, stream_));
    CUDA_ASSERT(cudaStreamSynchronize(stream_));
    Fetch(&pr);
    const std::vector<uint16_t> graph_out2 = pr.out_host;
    Poison(&pr);
    CUDA_ASSERT(LaunchMlaVerifyPath(pr.params, v.path, v.ws, stream_));
    CUDA_ASSERT(cudaStreamSynchronize(stream_));
    Fetch(&pr);
    ASSERT_EQ(0, std::memcmp(graph_out2.data(), pr.out_host.data(), graph_out2.size() * 2));
    // And that run is right.
    pr.shape.lens = lens2;
    Reference ref;
    GpuReference(pr, &ref);
    std::vector<float> out, lse;
    Densify(pr, &out, &lse);
    EXPECT_TRUE(CompareMlaOutput(out.data(), ref.out.data(), ref.absw.data(), out.size()).ok());
    CUDA_ASSERT(
        cudaMemcpy(pr.lens.ptr, shape.lens.data(), shape.lens.size() * 4, cudaMemcpyHostToDevice));
    pr.shape.lens = shape.lens;
    CUDA_ASSERT(cudaGraphExecDestroy(exec));
    CUDA_ASSERT(cudaGraphDestroy(graph));
  }
}

// One plan serves several layers: plan once, run twice with different q / out (each split path).
TEST_F(MlaVerifyGpuTest, OnePlanServesSeveralLayers) {
  Shape shape;
  shape.s_q = 2;
  shape.h_q = 32;
  shape.lens = {2000, 33, 7000};
  Problem a, b;
  Build(shape, &a);
  Build(shape, &b);
  b.params.cache_seqlens = a.params.cache_seqlens;  // one step: same lengths
  Reference ra, rb;
  GpuReference(a, &ra);
  GpuReference(b, &rb);
  for (const Variant& v : Variants()) {
    if (v.path == MlaVerifyPath::kBaseline) continue;
    SCOPED_TRACE(v.name);
    Poison(&a);
    Poison(&b);
    MlaVerifyPlan plan;
    CUDA_ASSERT(PlanMlaVerify(a.params, v.path, v.ws, stream_, &plan));
    EXPECT_EQ(plan.path, v.path);
    // Three requests: the sm_90a kernels plan in block, the portable path after the plan kernel.
    EXPECT_EQ(plan.plan_in_block, v.path == MlaVerifyPath::kSplitKvSm90a);
    if (v.path == MlaVerifyPath::kSplitKvSm90a) {
      EXPECT_NE(plan.sm90a_schedule, MlaVerifySm90aSchedule::kAuto);
      EXPECT_EQ(plan.sm90a_schedule,
                ChooseMlaVerifySm90aSchedule(*v.ws, shape.s_q * shape.h_q, a.params.batch));
      if (v.ws->sm90a_schedule != MlaVerifySm90aSchedule::kAuto &&
          v.ws->sm90a_schedule != MlaVerifySm90aSchedule::kSwapAb) {  // 64 rows: no swap-AB
        EXPECT_EQ(plan.sm90a_schedule, v.ws->sm90a_schedule);
      }
    }
    CUDA_ASSERT(RunMlaVerify(plan, a.params, stream_));
    CUDA_ASSERT(RunMlaVerify(plan, b.params, stream_));
    CUDA_ASSERT(cudaStreamSynchronize(stream_));
    for (auto [pr, ref] : {std::pair{&a, &ra}, std::pair{&b, &rb}}) {
      Fetch(pr);
      std::vector<float> out, lse;
      Densify(*pr, &out, &lse);
      EXPECT_TRUE(CompareMlaOutput(out.data(), ref->out.data(), ref->absw.data(), out.size()).ok());
      EXPECT_TRUE(CompareMlaLse(lse.data(), ref->lse.data(), lse.size()).ok());
    }
  }
}

// A plan runs only what it was made for: its shape, on its workspace, until the next plan there.
TEST_F(MlaVerifyGpuTest, PlansRefuseWhatTheyWereNotMadeFor) {
  Shape shape;
  shape.s_q = 2;
  shape.h_q = 16;
  shape.lens = {500, 64};
  Problem pr;
  Build(shape, &pr);
  MlaVerifyPlan plan;
  EXPECT_EQ(PlanMlaVerify(pr.params, MlaVerifyPath::kBaseline, ws_, stream_, &plan),
            cudaErrorInvalidValue);
  EXPECT_EQ(RunMlaVerify(plan, pr.params, stream_), cudaErrorInvalidValue);  // never made
  CUDA_ASSERT(PlanMlaVerify(pr.params, MlaVerifyPath::kSplitKv, ws_, stream_, &plan));
  MlaVerifyParams other = pr.params;
  other.s_q = 1;
  EXPECT_EQ(RunMlaVerify(plan, other, stream_), cudaErrorInvalidValue);
  other = pr.params;
  other.h_q = 32;
  EXPECT_EQ(RunMlaVerify(plan, other, stream_), cudaErrorInvalidValue);
  other = pr.params;
  other.batch = 1;
  EXPECT_EQ(RunMlaVerify(plan, other, stream_), cudaErrorInvalidValue);
  MlaVerifyPlan newer;
  CUDA_ASSERT(PlanMlaVerify(pr.params, MlaVerifyPath::kSplitKv, ws_, stream_, &newer));
  EXPECT_EQ(RunMlaVerify(plan, pr.params, stream_), cudaErrorInvalidValue);  // superseded
  CUDA_ASSERT(RunMlaVerify(newer, pr.params, stream_));
  if (!ws_->has_sm90a) {
    EXPECT_EQ(PlanMlaVerify(pr.params, MlaVerifyPath::kSplitKvSm90a, ws_, stream_, &plan),
              cudaErrorInvalidDeviceFunction);
  }
  CUDA_ASSERT(cudaStreamSynchronize(stream_));
  CUDA_ASSERT(cudaGetLastError());
}

// Many requests per block range with page counts of both parities, so that the sm_90a kernel's
// page pairs start at odd and even offsets, hold one page at a part's end, cross request
// boundaries (the next request's Q and pages loaded during the last pair) and meet the causal
// mask across a page boundary (s_q = 16).
TEST_F(MlaVerifyGpuTest, PagePairsAcrossRequests) {
  std::mt19937_64 rng(FreshSeed());
  for (auto [s_q, h_q, batch] :
       {std::tuple{1, 16, 90}, std::tuple{3, 16, 70}, std::tuple{16, 16, 40},
        std::tuple{2, 128, 30}, std::tuple{16, 64, 12}}) {
    Shape shape;
    shape.s_q = s_q;
    shape.h_q = h_q;
    shape.lens.resize(batch);
    for (size_t i = 0; i < shape.lens.size(); ++i) {
      const int kind = static_cast<int>(rng() % 6);
      int32_t& l = shape.lens[i];
      l = kind == 0   ? 64 * (1 + static_cast<int32_t>(rng() % 40))            // whole pages
          : kind == 1 ? 64 * (1 + static_cast<int32_t>(rng() % 40)) + s_q / 2  // mask across
          : kind == 2 ? static_cast<int32_t>(rng() % (s_q + 2))                // tiny, maybe < s_q
                      : 1 + static_cast<int32_t>(rng() % 5000);
    }
    CheckShape(shape, "pairs s_q=" + std::to_string(s_q) + " h_q=" + std::to_string(h_q));
    if (HasFatalFailure()) return;
  }
}

// The shapes swap-AB serves (s_q * h_q = 16 or 32): one long request split over every SM (and
// one just past a page), short and empty requests and rows that see no key (L < s_q), whole
// pages and the causal mask across a page boundary, many requests per block range (the Q double
// buffer and the box ring across request boundaries), and q / out as strided views.
TEST_F(MlaVerifyGpuTest, SwapAbShapes) {
  std::mt19937_64 rng(FreshSeed());
  for (auto [s_q, h_q] : {std::pair{1, 16}, std::pair{2, 16}, std::pair{1, 32}}) {
    const std::string name = "swap s_q=" + std::to_string(s_q) + " h_q=" + std::to_string(h_q);
    const int32_t rows = s_q * h_q;
    if (ws_->has_sm90a) {
      EXPECT_EQ(ChooseMlaVerifySm90aSchedule(*ws_swap_ab_, rows, 1),
                MlaVerifySm90aSchedule::kSwapAb);
      std::printf("[schedule] %d rows: batch 1 %s, batch 64 %s\n", rows,
                  MlaVerifySm90aScheduleName(ChooseMlaVerifySm90aSchedule(*ws_, rows, 1)),
                  MlaVerifySm90aScheduleName(ChooseMlaVerifySm90aSchedule(*ws_, rows, 64)));
    }
    Shape one;
    one.s_q = s_q;
    one.h_q = h_q;
    one.lens = {65536 + 37};
    CheckShape(one, name + " b1 x 65573");
    if (HasFatalFailure()) return;
    one.lens = {65};
    CheckShape(one, name + " b1 x 65");
    if (HasFatalFailure()) return;
    Shape mixed;
    mixed.s_q = s_q;
    mixed.h_q = h_q;
    mixed.lens = {0, 1, 2, 63, 64, 65, 0, 3000, 128, 64 * 7 + 1, 0};
    mixed.q_head_stride = 640;
    mixed.q_token_pad = 8 * 3;
    mixed.out_head_stride = 520;
    mixed.lse_head_pad = 1;
    CheckShape(mixed, name + " short, empty, strided");
    if (HasFatalFailure()) return;
    Shape many;
    many.s_q = s_q;
    many.h_q = h_q;
    many.lens.resize(160);
    for (int32_t& l : many.lens) {
      const int kind = static_cast<int>(rng() % 4);
      l = kind == 0   ? 64 * (1 + static_cast<int32_t>(rng() % 30))
          : kind == 1 ? static_cast<int32_t>(rng() % 3)
                      : 1 + static_cast<int32_t>(rng() % 4000);
    }
    CheckShape(many, name + " batch 160 mixed");
    if (HasFatalFailure()) return;
  }
}

TEST_F(MlaVerifyGpuTest, PathsAgreeWithinTheBound) {
  // split_kv (and split_kv_sm90a) against the baseline directly, element by element, with the
  // baseline's result standing in for the reference's value and the reference's error scale:
  // both are rounded to bf16, each within the bound of the truth, so they may differ by twice it
  // (one bf16 step apart where |out| + its weighted |V| is below 1: 1.22 of one bound, seen).
  // Against float64 each is held to the single bound.
  Shape shape;
  shape.s_q = 4;
  shape.h_q = 16;
  shape.lens = {9000, 3, 200, 64 * 40};
  Problem pr;
  Build(shape, &pr);
  Reference ref;
  GpuReference(pr, &ref);
  std::vector<std::vector<float>> outs;
  const std::vector<Variant> variants = Variants();
  for (const Variant& v : variants) {
    Poison(&pr);
    CUDA_ASSERT(LaunchMlaVerifyPath(pr.params, v.path, v.ws, stream_));
    CUDA_ASSERT(cudaStreamSynchronize(stream_));
    Fetch(&pr);
    std::vector<float> out, lse;
    Densify(pr, &out, &lse);
    EXPECT_TRUE(CompareMlaOutput(out.data(), ref.out.data(), ref.absw.data(), out.size()).ok())
        << v.name << " against float64, seed " << pr.seed;
    outs.push_back(out);
  }
  for (size_t k = 0; k < outs.size(); ++k) {
    if (k == 1) continue;  // the baseline itself
    std::vector<double> base(outs[1].begin(), outs[1].end());
    const MlaCompareResult r =
        CompareMlaOutput(outs[k].data(), base.data(), ref.absw.data(), base.size(), 2.0);
    std::printf("[worst] %s vs baseline: max_abs %.3g err/bound %.3f\n", variants[k].name.c_str(),
                r.max_abs_err, r.max_err_over_bound);
    EXPECT_TRUE(r.ok()) << variants[k].name << " differs from the baseline";
  }
}

TEST_F(MlaVerifyGpuTest, RejectsBadLaunches) {
  Shape shape;
  shape.lens = {100};
  Problem pr;
  Build(shape, &pr);
  MlaVerifyParams p = pr.params;
  p.h_q = 24;
  EXPECT_EQ(LaunchMlaVerify(p, ws_, stream_), cudaErrorInvalidValue);
  p = pr.params;
  p.batch = ws_->max_batch + 1;
  EXPECT_EQ(LaunchMlaVerifyBaseline(p, ws_, stream_), cudaErrorInvalidValue);
  CUDA_ASSERT(cudaGetLastError());
}

}  // namespace
}  // namespace probesidecar::kernels

int main(int argc, char** argv) {
  return probesidecar::kernels::gpu_test::RunGpuTests(argc, argv, &probesidecar::kernels::g_family);
}
