// Probe scoring on the GPU: weights, workspace, launch plans and the launcher. The kernels are in
// probe_score_kernel.cuh (instantiated in probe_score_fused.cu, probe_score_tc.cu and here).
#include <cublas_v2.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <vector>

#include "kernels/probe_score/probe_score.h"
#include "kernels/probe_score/probe_score_internal.h"
#include "kernels/probe_score/probe_score_kernel.cuh"

namespace probesidecar::kernels {

using probe_score_detail::EpilogueParams;
using probe_score_detail::FusedCudaParams;
using probe_score_detail::GatherParams;
using probe_score_detail::kFusedRowsPerBlock;
using probe_score_detail::kFusedThreads;
using probe_score_detail::kHiddenPad;
using probe_score_detail::kNumFusedPT;
using probe_score_detail::kNumTcConfigs;
using probe_score_detail::kProbePad;
using probe_score_detail::SplitKReduceParams;
using probe_score_detail::TcConfigInfo;
using probe_score_detail::TcParams;

namespace {

constexpr int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
constexpr int64_t RoundUp(int64_t a, int64_t b) { return CeilDiv(a, b) * b; }

constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;  // cuBLAS's advice for Hopper
constexpr size_t kPartialBytes = size_t{32} << 20;          // split-K partial sums
constexpr int32_t kNumCounters = 65536;                     // split-K tile counters
constexpr size_t kStagingCapBytes = size_t{128} << 20;      // each gather_gemm staging buffer
constexpr int kFusedSmemLimit = 64 << 10;                   // W slice of fused_cuda, bytes

int64_t PaddedProbes(int32_t num_probes) { return RoundUp(num_probes, kProbePad); }
int64_t PaddedHidden(int32_t hidden) { return RoundUp(hidden, kHiddenPad); }

cudaError_t FromCublas(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return cudaSuccess;
    case CUBLAS_STATUS_ALLOC_FAILED:
      return cudaErrorMemoryAllocation;
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return cudaErrorInitializationError;
    case CUBLAS_STATUS_INVALID_VALUE:
      return cudaErrorInvalidValue;
    case CUBLAS_STATUS_ARCH_MISMATCH:
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return cudaErrorNotSupported;
    default:
      return cudaErrorUnknown;
  }
}

int FusedPtIndex(int32_t num_probes) {
  if (num_probes <= 1) return 0;
  if (num_probes <= 2) return 1;
  if (num_probes <= 4) return 2;
  if (num_probes <= 8) return 3;
  return 4;
}

}  // namespace

struct ProbeScoreWorkspace {
  ProbeScoreWorkspaceConfig config;
  int device = 0;
  int num_sms = 0;
  int64_t l2_bytes = 0;
  int64_t smem_per_sm = 0;
  int64_t reserved_smem_per_block = 0;
  int max_threads_per_sm = 2048;
  int regs_per_sm = 65536;
  int fused_regs[common::kNumDTypes][kNumFusedPT] = {};

  cublasHandle_t cublas = nullptr;
  void* storage = nullptr;  // the one allocation behind the buffers below
  void* cublas_ws = nullptr;
  float* partial = nullptr;
  size_t partial_floats = 0;
  int32_t* counters = nullptr;
  void* staging_x = nullptr;
  size_t staging_x_bytes = 0;
  float* staging_c = nullptr;
  size_t staging_c_bytes = 0;
  ProbeScoreTuning tuning;
};

// ---------------------------------------------------------------------------------------------
// Weights.

cudaError_t CreateProbeWeights(const float* weight, const float* bias, int32_t num_probes,
                               int32_t hidden, ProbeWeights* out) {
  if (weight == nullptr || bias == nullptr || out == nullptr || num_probes < 1 || hidden < 1) {
    return cudaErrorInvalidValue;
  }
  *out = ProbeWeights{};
  const int64_t p_pad = PaddedProbes(num_probes), h_pad = PaddedHidden(hidden);
  const size_t bias_bytes = RoundUp(static_cast<int64_t>(num_probes) * 4, 256);
  const size_t w32_bytes = static_cast<size_t>(p_pad * h_pad * 4);
  const size_t w16_bytes = static_cast<size_t>(p_pad * h_pad * 2);
  const size_t total = bias_bytes + w32_bytes + 2 * w16_bytes;
  // Layout: bias | W fp32 | W fp16 | W bf16, each [p_pad, h_pad] with zero padding (the tiles of
  // the tensor-core kernel read whole 64 x 128 blocks of W without bounds checks).
  std::vector<float> w32;
  std::vector<uint16_t> w16, wb16;
  try {
    w32.assign(static_cast<size_t>(p_pad * h_pad), 0.0f);
    w16.assign(static_cast<size_t>(p_pad * h_pad), 0);
    wb16.assign(static_cast<size_t>(p_pad * h_pad), 0);
  } catch (const std::bad_alloc&) {
    return cudaErrorMemoryAllocation;
  }
  for (int64_t p = 0; p < num_probes; ++p) {
    for (int64_t h = 0; h < hidden; ++h) {
      const float v = weight[p * hidden + h];
      w32[p * h_pad + h] = v;
      w16[p * h_pad + h] = common::FloatToHalf(v);
      wb16[p * h_pad + h] = common::FloatToBf16(v);
    }
  }
  char* storage = nullptr;
  cudaError_t err = cudaMalloc(&storage, total);
  if (err != cudaSuccess) return err;
  char* bias_d = storage;
  char* w32_d = bias_d + bias_bytes;
  char* w16_d = w32_d + w32_bytes;
  char* wb16_d = w16_d + w16_bytes;
  err = cudaMemcpy(bias_d, bias, static_cast<size_t>(num_probes) * 4, cudaMemcpyHostToDevice);
  if (err == cudaSuccess) err = cudaMemcpy(w32_d, w32.data(), w32_bytes, cudaMemcpyHostToDevice);
  if (err == cudaSuccess) err = cudaMemcpy(w16_d, w16.data(), w16_bytes, cudaMemcpyHostToDevice);
  if (err == cudaSuccess) {
    err = cudaMemcpy(wb16_d, wb16.data(), w16_bytes, cudaMemcpyHostToDevice);
  }
  if (err != cudaSuccess) {
    cudaFree(storage);
    return err;
  }
  out->num_probes = num_probes;
  out->hidden = hidden;
  out->bias = reinterpret_cast<const float*>(bias_d);
  out->weight[static_cast<int>(common::DType::kFloat32)] = w32_d;
  out->weight[static_cast<int>(common::DType::kFloat16)] = w16_d;
  out->weight[static_cast<int>(common::DType::kBFloat16)] = wb16_d;
  out->storage = storage;
  out->storage_bytes = total;
  return cudaSuccess;
}

cudaError_t DestroyProbeWeights(ProbeWeights* weights) {
  if (weights == nullptr) return cudaErrorInvalidValue;
  cudaError_t err = cudaSuccess;
  if (weights->storage != nullptr) err = cudaFree(weights->storage);
  *weights = ProbeWeights{};
  return err;
}

// ---------------------------------------------------------------------------------------------
// Workspace: device properties, kernel attributes and every scratch buffer, once.

cudaError_t CreateProbeScoreWorkspace(const ProbeScoreWorkspaceConfig& config,
                                      ProbeScoreWorkspace** out) {
  if (out == nullptr || config.max_rows < 1 || config.max_hidden < 1 || config.max_probes < 1) {
    return cudaErrorInvalidValue;
  }
  *out = nullptr;
  auto* ws = new (std::nothrow) ProbeScoreWorkspace();
  if (ws == nullptr) return cudaErrorMemoryAllocation;
  ws->config = config;
  auto fail = [&](cudaError_t e) {
    DestroyProbeScoreWorkspace(ws);
    return e;
  };

  cudaError_t err = cudaGetDevice(&ws->device);
  if (err != cudaSuccess) return fail(err);
  int v = 0;
  if ((err = cudaDeviceGetAttribute(&ws->num_sms, cudaDevAttrMultiProcessorCount, ws->device)) !=
      cudaSuccess) {
    return fail(err);
  }
  if ((err = cudaDeviceGetAttribute(&v, cudaDevAttrL2CacheSize, ws->device)) != cudaSuccess) {
    return fail(err);
  }
  ws->l2_bytes = v;
  if ((err = cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerMultiprocessor, ws->device)) !=
      cudaSuccess) {
    return fail(err);
  }
  ws->smem_per_sm = v;
  if ((err = cudaDeviceGetAttribute(&v, cudaDevAttrReservedSharedMemoryPerBlock, ws->device)) !=
      cudaSuccess) {
    return fail(err);
  }
  ws->reserved_smem_per_block = v;
  if ((err = cudaDeviceGetAttribute(&ws->max_threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor,
                                    ws->device)) != cudaSuccess) {
    return fail(err);
  }
  if ((err = cudaDeviceGetAttribute(&ws->regs_per_sm, cudaDevAttrMaxRegistersPerMultiprocessor,
                                    ws->device)) != cudaSuccess) {
    return fail(err);
  }

  // Kernel attributes: raised shared-memory limits, registers and occupancy, read once here so
  // that launches only do arithmetic.
  for (int d = 0; d < common::kNumDTypes; ++d) {
    const common::DType dtype = static_cast<common::DType>(d);
    for (int i = 0; i < kNumFusedPT; ++i) {
      const void* fn = probe_score_detail::FusedCudaKernelFn(dtype, i);
      if ((err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      kFusedSmemLimit)) != cudaSuccess) {
        return fail(err);
      }
      cudaFuncAttributes attr{};
      if ((err = cudaFuncGetAttributes(&attr, fn)) != cudaSuccess) return fail(err);
      ws->fused_regs[d][i] = attr.numRegs;
    }
    for (int c = 0; c < kNumTcConfigs; ++c) {
      const void* fn = probe_score_detail::FusedTcKernelFn(dtype, c);
      if (fn == nullptr) continue;
      const TcConfigInfo info = probe_score_detail::GetTcConfig(c);
      if ((err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      info.smem_bytes)) != cudaSuccess) {
        return fail(err);
      }
    }
  }

  // Scratch sizes.
  const int64_t p_pad = PaddedProbes(config.max_probes);
  const size_t min_rows = static_cast<size_t>(std::min<int32_t>(config.max_rows, 256));
  ws->staging_x_bytes = RoundUp(
      static_cast<int64_t>(std::min(
          static_cast<size_t>(config.max_rows) * config.max_hidden * 4,
          std::max(kStagingCapBytes, min_rows * static_cast<size_t>(config.max_hidden) * 4))),
      256);
  ws->staging_c_bytes =
      RoundUp(static_cast<int64_t>(std::min(static_cast<size_t>(config.max_rows) * p_pad * 4,
                                            std::max(kStagingCapBytes, min_rows * p_pad * 4))),
              256);
  ws->partial_floats = kPartialBytes / 4;
  const size_t counters_bytes = kNumCounters * sizeof(int32_t);
  const size_t total = kCublasWorkspaceBytes + kPartialBytes + counters_bytes +
                       ws->staging_x_bytes + ws->staging_c_bytes;
  if ((err = cudaMalloc(&ws->storage, total)) != cudaSuccess) {
    ws->storage = nullptr;
    return fail(err);
  }
  char* p = static_cast<char*>(ws->storage);
  ws->cublas_ws = p;
  p += kCublasWorkspaceBytes;
  ws->partial = reinterpret_cast<float*>(p);
  p += kPartialBytes;
  ws->counters = reinterpret_cast<int32_t*>(p);
  p += counters_bytes;
  ws->staging_x = p;
  p += ws->staging_x_bytes;
  ws->staging_c = reinterpret_cast<float*>(p);
  if ((err = cudaMemset(ws->counters, 0, counters_bytes)) != cudaSuccess) return fail(err);
  if ((err = cudaDeviceSynchronize()) != cudaSuccess) return fail(err);

  cublasStatus_t st = cublasCreate(&ws->cublas);
  if (st != CUBLAS_STATUS_SUCCESS) {
    ws->cublas = nullptr;
    return fail(FromCublas(st));
  }
  // No TF32: fp32 activations must stay within 1e-5 of the float64 reference.
  if ((st = cublasSetMathMode(ws->cublas, CUBLAS_DEFAULT_MATH)) != CUBLAS_STATUS_SUCCESS) {
    return fail(FromCublas(st));
  }
  *out = ws;
  return cudaSuccess;
}

void DestroyProbeScoreWorkspace(ProbeScoreWorkspace* workspace) {
  if (workspace == nullptr) return;
  if (workspace->cublas != nullptr) cublasDestroy(workspace->cublas);
  if (workspace->storage != nullptr) cudaFree(workspace->storage);
  delete workspace;
}

void SetProbeScoreTuning(ProbeScoreWorkspace* workspace, const ProbeScoreTuning& tuning) {
  if (workspace != nullptr) workspace->tuning = tuning;
}

int32_t ProbeScoreWorkspaceNumSms(const ProbeScoreWorkspace* workspace) {
  return workspace == nullptr ? 0 : workspace->num_sms;
}

// ---------------------------------------------------------------------------------------------
// Launch plans: host arithmetic on (max_rows, P, H) and the properties read at creation.

namespace {

int FusedOccupancy(const ProbeScoreWorkspace& ws, common::DType dtype, int pt_index, int smem_bytes) {
  const int regs = std::max(ws.fused_regs[static_cast<int>(dtype)][pt_index], 1);
  const int regs_per_warp = static_cast<int>(RoundUp(regs * 32, 256));
  const int warps = kFusedThreads / 32;
  const int by_regs = ws.regs_per_sm / (regs_per_warp * warps);
  const int by_threads = ws.max_threads_per_sm / kFusedThreads;
  const int by_smem =
      static_cast<int>(ws.smem_per_sm / (smem_bytes + ws.reserved_smem_per_block + 1024));
  return std::max(1, std::min({by_regs, by_threads, by_smem}));
}

struct FusedPlan {
  FusedCudaParams params;
  int pt_index = 0;
  dim3 grid;
  int smem_bytes = 0;
};

cudaError_t PlanFused(const ProbeScoreParams& in, const ProbeScoreWorkspace& ws, FusedPlan* plan) {
  const ProbeWeights& w = *in.weights;
  const int32_t P = w.num_probes, H = w.hidden;
  const int pt_index = FusedPtIndex(P);
  const int pt = probe_score_detail::kFusedPTValues[pt_index];
  const int vec = in.x_dtype == common::DType::kFloat32 ? 4 : 8;
  const int gran = 32 * vec;
  const int64_t k_chunks = CeilDiv(H, gran);
  const int64_t smem_chunks = std::max<int64_t>(1, (kFusedSmemLimit / (pt * 4)) / gran);
  const int64_t row_blocks = CeilDiv(in.max_rows, kFusedRowsPerBlock);
  const int64_t probe_tiles = CeilDiv(P, pt);

  // W slice held in shared memory: the whole K range of a split when it fits.
  const int64_t smem_bytes_full = std::min(k_chunks, smem_chunks) * gran * pt * 4;
  const int occ = FusedOccupancy(ws, in.x_dtype, pt_index, static_cast<int>(smem_bytes_full));
  const int64_t target_blocks = static_cast<int64_t>(ws.num_sms) * occ;

  // K splits only when rows x probe tiles fill less than half the machine (few rows): the
  // fix-up costs a few dependent memory round trips at the tail (bench/NOTES.md, run 1).
  int64_t splits = 1;
  if (2 * row_blocks * probe_tiles <= target_blocks) {
    splits = std::min(k_chunks, CeilDiv(target_blocks, row_blocks * probe_tiles));
  }
  if (ws.tuning.splits > 0) splits = std::min<int64_t>(ws.tuning.splits, k_chunks);
  const int64_t partial_per_split = static_cast<int64_t>(in.max_rows) * probe_tiles * pt;
  if (splits > 1 && splits * partial_per_split > static_cast<int64_t>(ws.partial_floats)) {
    splits = std::max<int64_t>(1, static_cast<int64_t>(ws.partial_floats) / partial_per_split);
  }
  const int64_t chunks_per_split = CeilDiv(k_chunks, splits);
  splits = CeilDiv(k_chunks, chunks_per_split);  // every split non-empty
  const int64_t k_per_split = chunks_per_split * gran;
  const int64_t k_per_smem = std::min(chunks_per_split, smem_chunks) * gran;

  int64_t row_groups = std::min(row_blocks, CeilDiv(target_blocks, splits * probe_tiles));
  row_groups = std::max<int64_t>(row_groups, 1);
  const int64_t iters = CeilDiv(row_blocks, row_groups);
  row_groups = CeilDiv(row_blocks, iters);  // balanced: every group does `iters` row blocks
  if (splits > 1 && row_groups * probe_tiles > kNumCounters) return cudaErrorInvalidValue;
  if (probe_tiles > 65535 || splits > 65535) return cudaErrorInvalidValue;

  FusedCudaParams& p = plan->params;
  p = FusedCudaParams{};
  p.args = in.args;
  p.rows = in.rows;
  p.weight = static_cast<const float*>(w.weight[static_cast<int>(common::DType::kFloat32)]);
  p.bias = w.bias;
  p.partial = ws.partial;
  p.counters = ws.counters;
  p.max_rows = in.max_rows;
  p.hidden = H;
  p.num_probes = P;
  p.w_row_stride = static_cast<int32_t>(PaddedHidden(H));
  p.splits = static_cast<int32_t>(splits);
  p.k_per_split = static_cast<int32_t>(k_per_split);
  p.k_per_smem = static_cast<int32_t>(k_per_smem);
  p.row_groups = static_cast<int32_t>(row_groups);
  p.probe_tiles = static_cast<int32_t>(probe_tiles);
  p.activation = static_cast<int32_t>(in.activation);
  plan->pt_index = pt_index;
  plan->grid = dim3(static_cast<unsigned>(row_groups), static_cast<unsigned>(splits),
                    static_cast<unsigned>(probe_tiles));
  plan->smem_bytes = static_cast<int>(pt * k_per_smem * 4);
  return cudaSuccess;
}

struct TcPlan {
  TcParams params;
  int config = 0;
  dim3 grid;
  SplitKReduceParams reduce;
  int64_t reduce_blocks = 0;
};

// Tile configuration for fused_tc (see probe_score_tc.cu), from the variants measured in run 2
// (bench/results/probe_score.md, "Variants"; graph replay µs, bf16, H = 4096):
//  - P <= 16: 64x16 below 768 rows; 64x16k128 up to 6K rows (R=1024 P=16: 10.0 vs 10.6 / 12.3;
//    R=4096: 16.6 vs 17.5 / 16.9); 32x16k256 beyond (R=8192: 23.7 vs 25.9 / 25.3).
//  - R <= 64, P <= 256: 64x16 with 8 splits (R=64 P=128: 8.8 vs 64x64 s16 9.8).
//  - otherwise 64x64, or 128x128 once its tiles cover the SMs.
int ChooseTcConfig(int32_t max_rows, int32_t num_probes, int num_sms) {
  if (num_probes <= 16) return max_rows >= 6144 ? 3 : (max_rows >= 768 ? 4 : 0);
  if (max_rows <= 64 && num_probes <= 256) return 0;
  if (num_probes <= 64) return 1;
  const int64_t big_tiles = CeilDiv(max_rows, 128) * CeilDiv(num_probes, 128);
  return big_tiles >= num_sms ? 2 : 1;
}

// The fused_tc plan depends on the device only through its SM count (and the fixed partial
// buffer size): PlanTcFor is host arithmetic, also used to label benchmark reports.
struct TcPlanInputs {
  int num_sms = 0;
  size_t partial_floats = 0;
  float* partial = nullptr;
  ProbeScoreTuning tuning;
};

cudaError_t PlanTcFor(const ProbeScoreParams& in, const TcPlanInputs& ws, TcPlan* plan) {
  const ProbeWeights& w = *in.weights;
  const int32_t P = w.num_probes, H = w.hidden;
  int config = ws.tuning.tc_config >= 0 && ws.tuning.tc_config < kNumTcConfigs
                   ? ws.tuning.tc_config
                   : ChooseTcConfig(in.max_rows, P, ws.num_sms);
  const TcConfigInfo info = probe_score_detail::GetTcConfig(config);
  const int64_t m_tiles = CeilDiv(in.max_rows, info.bm);
  const int64_t n_tiles = CeilDiv(P, info.bn);
  const int64_t tiles = m_tiles * n_tiles;
  const int64_t k_tiles = CeilDiv(H, info.bk);
  // Split K only when the tiles cannot cover the SMs (few rows), each split at least 4 K tiles
  // long; the partials go through a second (reduction) kernel. About one CTA per SM in general;
  // for a single row tile with few probe tiles (R <= 64 with P up to a few hundred) about two,
  // at most 16 splits: R=64 P=1024 64x64 took 15.3 / 12.1 / 11.7 µs with 4 / 8 / 16 splits
  // (run 2, 16 is the most measured), and 64x16 beyond 16 probes 8 splits, as measured.
  int64_t splits = 1;
  const int64_t max_splits = std::max<int64_t>(1, k_tiles / 4);
  if (m_tiles == 1 && tiles * 4 <= ws.num_sms) {
    splits = std::min(max_splits, CeilDiv(2 * ws.num_sms, tiles));
    if (config != 0) splits = std::min<int64_t>(splits, 16);
    if (config == 0 && P > 16) splits = std::min<int64_t>(splits, 8);
  } else if (tiles < ws.num_sms) {
    splits = std::min(max_splits, CeilDiv(ws.num_sms, tiles));
  }
  if (ws.tuning.splits > 0) splits = std::min<int64_t>(ws.tuning.splits, k_tiles);
  const int64_t partial_rows = m_tiles * info.bm, partial_ld = n_tiles * info.bn;
  if (splits > 1 && splits * partial_rows * partial_ld > static_cast<int64_t>(ws.partial_floats)) {
    splits =
        std::max<int64_t>(1, static_cast<int64_t>(ws.partial_floats) / (partial_rows * partial_ld));
  }
  if (n_tiles > 2147483647 || m_tiles > 65535 || splits > 65535) return cudaErrorInvalidValue;

  TcParams& p = plan->params;
  p = TcParams{};
  p.args = in.args;
  p.rows = in.rows;
  p.weight = w.weight[static_cast<int>(in.x_dtype)];
  p.bias = w.bias;
  p.partial = ws.partial;
  p.partial_rows = static_cast<int32_t>(partial_rows);
  p.partial_ld = static_cast<int32_t>(partial_ld);
  p.max_rows = in.max_rows;
  p.hidden = H;
  p.num_probes = P;
  p.w_row_stride = static_cast<int32_t>(PaddedHidden(H));
  p.k_tiles = static_cast<int32_t>(k_tiles);
  p.splits = static_cast<int32_t>(splits);
  p.activation = static_cast<int32_t>(in.activation);
  plan->config = config;
  plan->grid = dim3(static_cast<unsigned>(n_tiles), static_cast<unsigned>(m_tiles),
                    static_cast<unsigned>(splits));
  SplitKReduceParams& r = plan->reduce;
  r.args = in.args;
  r.partial = ws.partial;
  r.bias = w.bias;
  r.splits = p.splits;
  r.partial_rows = p.partial_rows;
  r.partial_ld = p.partial_ld;
  r.max_rows = in.max_rows;
  r.num_probes = P;
  r.activation = p.activation;
  plan->reduce_blocks = CeilDiv(static_cast<int64_t>(in.max_rows) * P, 256);
  return cudaSuccess;
}

cudaError_t PlanTc(const ProbeScoreParams& in, const ProbeScoreWorkspace& ws, TcPlan* plan) {
  TcPlanInputs inputs;
  inputs.num_sms = ws.num_sms;
  inputs.partial_floats = ws.partial_floats;
  inputs.partial = ws.partial;
  inputs.tuning = ws.tuning;
  return PlanTcFor(in, inputs, plan);
}

struct GatherPlan {
  int64_t chunk_rows = 0;
  int64_t num_chunks = 0;
  int64_t ldc = 0;
};

// gather_gemm: gather -> cuBLAS -> epilogue, in as few row chunks as the staging buffers
// allow. (Chunks sized to stay in L2 were measured slower: cuBLAS loses more at small M than
// the staging round trip costs, bench/NOTES.md run 1.)
cudaError_t PlanGather(const ProbeScoreParams& in, const ProbeScoreWorkspace& ws,
                       GatherPlan* plan) {
  const ProbeWeights& w = *in.weights;
  const int64_t elem = common::DTypeSize(in.x_dtype);
  const int64_t ldc = RoundUp(w.num_probes, 4);
  const int64_t x_row = w.hidden * elem, c_row = ldc * 4;
  const int64_t cap_rows = std::min<int64_t>(static_cast<int64_t>(ws.staging_x_bytes) / x_row,
                                             static_cast<int64_t>(ws.staging_c_bytes) / c_row);
  if (cap_rows < 1) return cudaErrorInvalidValue;
  int64_t chunk = in.max_rows;
  if (ws.tuning.gather_chunk_rows > 0) {
    chunk = std::min<int64_t>(chunk, ws.tuning.gather_chunk_rows);
  }
  if (chunk > cap_rows) {
    // Equal chunks rather than a full one and a small tail.
    const int64_t n = CeilDiv(chunk, cap_rows);
    chunk = RoundUp(CeilDiv(chunk, n), 64);
    if (chunk > cap_rows) chunk = cap_rows;
  }
  chunk = std::max<int64_t>(1, chunk);
  plan->chunk_rows = chunk;
  plan->num_chunks = CeilDiv(in.max_rows, chunk);
  plan->ldc = ldc;
  return cudaSuccess;
}

cudaError_t Validate(const ProbeScoreParams& params, ProbeScorePath path,
                     const ProbeScoreWorkspace* ws) {
  if (ws == nullptr || params.args == nullptr || params.rows == nullptr ||
      params.weights == nullptr || params.weights->storage == nullptr || params.max_rows < 0) {
    return cudaErrorInvalidValue;
  }
  const ProbeWeights& w = *params.weights;
  if (params.max_rows > ws->config.max_rows || w.hidden > ws->config.max_hidden ||
      w.num_probes > ws->config.max_probes) {
    return cudaErrorInvalidValue;
  }
  if (static_cast<int>(params.x_dtype) < 0 || static_cast<int>(params.x_dtype) >= common::kNumDTypes) {
    return cudaErrorInvalidValue;
  }
  if (!ProbeScorePathSupports(path, params.x_dtype, w.num_probes, w.hidden)) {
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

cudaDataType_t CudaType(common::DType dtype) {
  switch (dtype) {
    case common::DType::kFloat32:
      return CUDA_R_32F;
    case common::DType::kFloat16:
      return CUDA_R_16F;
    case common::DType::kBFloat16:
      return CUDA_R_16BF;
  }
  return CUDA_R_32F;
}

template <typename T>
void LaunchGather(const GatherParams& p, cudaStream_t stream) {
  probe_score_detail::GatherRowsKernel<T>
      <<<static_cast<unsigned>(CeilDiv(p.chunk_rows, 8)), 256, 0, stream>>>(p);
}

cudaError_t LaunchGatherGemm(const ProbeScoreParams& in, ProbeScoreWorkspace& ws,
                             cudaStream_t stream) {
  GatherPlan plan;
  cudaError_t err = PlanGather(in, ws, &plan);
  if (err != cudaSuccess) return err;
  const ProbeWeights& w = *in.weights;
  const int32_t P = w.num_probes, H = w.hidden;
  cublasStatus_t st = cublasSetStream(ws.cublas, stream);
  // cublasSetStream resets the workspace to cuBLAS's own pool: set ours again (no allocation
  // may happen inside a captured graph).
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = cublasSetWorkspace(ws.cublas, ws.cublas_ws, kCublasWorkspaceBytes);
  }
  if (st != CUBLAS_STATUS_SUCCESS) return FromCublas(st);
  const float one = 1.0f, zero = 0.0f;
  const cudaDataType_t type = CudaType(in.x_dtype);
  for (int64_t c = 0; c < plan.num_chunks; ++c) {
    const int32_t row_begin = static_cast<int32_t>(c * plan.chunk_rows);
    const int32_t n =
        static_cast<int32_t>(std::min<int64_t>(plan.chunk_rows, in.max_rows - row_begin));
    GatherParams gp;
    gp.args = in.args;
    gp.rows = in.rows;
    gp.staging = ws.staging_x;
    gp.hidden = H;
    gp.row_begin = row_begin;
    gp.chunk_rows = n;
    switch (in.x_dtype) {
      case common::DType::kFloat32:
        LaunchGather<float>(gp, stream);
        break;
      case common::DType::kFloat16:
        LaunchGather<__half>(gp, stream);
        break;
      case common::DType::kBFloat16:
        LaunchGather<__nv_bfloat16>(gp, stream);
        break;
    }
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
    // Column-major view: C^T [P, n] = W [P, H] (row-major = col-major H x P, transposed) times
    // staging^T [H, n] (row-major [n, H] = col-major H x n).
    st = cublasGemmEx(
        ws.cublas, CUBLAS_OP_T, CUBLAS_OP_N, P, n, H, &one, w.weight[static_cast<int>(in.x_dtype)],
        type, static_cast<int>(PaddedHidden(H)), ws.staging_x, type, H, &zero, ws.staging_c,
        CUDA_R_32F, static_cast<int>(plan.ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) return FromCublas(st);
    EpilogueParams ep;
    ep.args = in.args;
    ep.c = ws.staging_c;
    ep.ldc = static_cast<int32_t>(plan.ldc);
    ep.bias = w.bias;
    ep.num_probes = P;
    ep.row_begin = row_begin;
    ep.chunk_rows = n;
    ep.activation = static_cast<int32_t>(in.activation);
    probe_score_detail::GemmEpilogueKernel<256>
        <<<static_cast<unsigned>(CeilDiv(static_cast<int64_t>(n) * P, 256)), 256, 0, stream>>>(ep);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t PlanProbeScore(const ProbeScoreParams& params, ProbeScorePath path,
                           const ProbeScoreWorkspace* workspace, ProbeScorePlan* plan) {
  if (plan == nullptr) return cudaErrorInvalidValue;
  cudaError_t err = Validate(params, path, workspace);
  if (err != cudaSuccess) return err;
  *plan = ProbeScorePlan{};
  plan->path = path;
  if (params.max_rows == 0) return cudaSuccess;
  switch (path) {
    case ProbeScorePath::kFusedCuda: {
      FusedPlan fp;
      if ((err = PlanFused(params, *workspace, &fp)) != cudaSuccess) return err;
      plan->config = probe_score_detail::kFusedPTValues[fp.pt_index];
      plan->splits = fp.params.splits;
      plan->grid_x = fp.grid.x;
      plan->grid_y = fp.grid.y;
      plan->grid_z = fp.grid.z;
      plan->smem_bytes = fp.smem_bytes;
      return cudaSuccess;
    }
    case ProbeScorePath::kFusedTensorCore: {
      TcPlan tp;
      if ((err = PlanTc(params, *workspace, &tp)) != cudaSuccess) return err;
      plan->config = tp.config;
      plan->splits = tp.params.splits;
      plan->grid_x = tp.grid.x;
      plan->grid_y = tp.grid.y;
      plan->grid_z = tp.grid.z;
      plan->smem_bytes = probe_score_detail::GetTcConfig(tp.config).smem_bytes;
      return cudaSuccess;
    }
    case ProbeScorePath::kGatherGemm: {
      GatherPlan gp;
      if ((err = PlanGather(params, *workspace, &gp)) != cudaSuccess) return err;
      plan->chunk_rows = static_cast<int32_t>(gp.chunk_rows);
      plan->num_chunks = static_cast<int32_t>(gp.num_chunks);
      return cudaSuccess;
    }
  }
  return cudaErrorInvalidValue;
}

cudaError_t PlanFusedTcOnHost(int32_t max_rows, int32_t num_probes, int32_t hidden, int32_t num_sms,
                              int32_t* config, int32_t* splits) {
  if (config == nullptr || splits == nullptr || max_rows < 1 || num_probes < 1 || hidden < 1 ||
      num_sms < 1) {
    return cudaErrorInvalidValue;
  }
  ProbeWeights w;
  w.num_probes = num_probes;
  w.hidden = hidden;
  ProbeScoreParams params;
  params.max_rows = max_rows;
  params.weights = &w;
  TcPlanInputs inputs;
  inputs.num_sms = num_sms;
  inputs.partial_floats = kPartialBytes / 4;
  TcPlan plan;
  const cudaError_t err = PlanTcFor(params, inputs, &plan);
  if (err != cudaSuccess) return err;
  *config = plan.config;
  *splits = plan.params.splits;
  return cudaSuccess;
}

cudaError_t LaunchProbeScore(const ProbeScoreParams& params, ProbeScorePath path,
                             ProbeScoreWorkspace* workspace, cudaStream_t stream) {
  cudaError_t err = Validate(params, path, workspace);
  if (err != cudaSuccess) return err;
  if (params.max_rows == 0) return cudaSuccess;
  switch (path) {
    case ProbeScorePath::kFusedCuda: {
      FusedPlan fp;
      if ((err = PlanFused(params, *workspace, &fp)) != cudaSuccess) return err;
      return probe_score_detail::LaunchFusedCudaKernel(params.x_dtype, fp.pt_index, fp.params,
                                                       fp.grid, fp.smem_bytes, stream);
    }
    case ProbeScorePath::kFusedTensorCore: {
      TcPlan tp;
      if ((err = PlanTc(params, *workspace, &tp)) != cudaSuccess) return err;
      err = probe_score_detail::LaunchFusedTcKernel(params.x_dtype, tp.config, tp.params, tp.grid,
                                                    stream);
      if (err != cudaSuccess || tp.params.splits == 1) return err;
      probe_score_detail::SplitKReduceKernel<256>
          <<<static_cast<unsigned>(tp.reduce_blocks), 256, 0, stream>>>(tp.reduce);
      return cudaGetLastError();
    }
    case ProbeScorePath::kGatherGemm:
      if ((err = LaunchGatherGemm(params, *workspace, stream)) != cudaSuccess) return err;
      return cudaGetLastError();
  }
  return cudaErrorInvalidValue;
}

}  // namespace probesidecar::kernels
