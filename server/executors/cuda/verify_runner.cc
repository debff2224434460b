#include "server/executors/cuda/verify_runner.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/mla_verify/mla_verify_limits.h"
#include "server/executors/cuda/cuda_status.h"

namespace probesidecar::server {
namespace {

constexpr int64_t kDimQk = kernels::kMlaHeadDimQk;
constexpr int64_t kDimV = kernels::kMlaHeadDimV;
// Inline tables are small: their buffers start at 64 KiB.
constexpr size_t kTableMinBytes = size_t{1} << 16;

uint32_t Bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

const __nv_bfloat16* Bf16(const BufferLease& lease) {
  return static_cast<const __nv_bfloat16*>(lease.device_ptr);
}

}  // namespace

VerifyRunner::VerifyRunner(StreamSlot* slot, std::atomic<int64_t>* device_bytes,
                           size_t graph_cache_entries)
    : slot_(slot),
      device_(slot->device()),
      stream_(slot->stream()),
      device_bytes_(device_bytes),
      scratch_(StagingBuffer::Kind::kDevice, device_bytes),
      h_table_(StagingBuffer::Kind::kPinned, device_bytes, kTableMinBytes),
      d_table_(StagingBuffer::Kind::kDevice, device_bytes, kTableMinBytes),
      graphs_(graph_cache_entries, [this](Graph& graph) {
        if (graph.exec != nullptr) {
          cudaStreamSynchronize(stream_);
          cudaGraphExecDestroy(graph.exec);
        }
      }) {}

VerifyRunner::~VerifyRunner() {
  cudaSetDevice(device_);
  graphs_.Clear();
  if (workspace_ != nullptr) {
    *device_bytes_ -= static_cast<int64_t>(workspace_->bytes);
    kernels::DestroyMlaVerifyWorkspace(workspace_);
  }
  for (void* p : {static_cast<void*>(safe_lengths_), static_cast<void*>(invalid_),
                  static_cast<void*>(partials_)}) {
    cudaFree(p);
  }
  for (StagingBuffer* b : {&scratch_, &h_table_, &d_table_}) b->Free();
  for (void* p : {static_cast<void*>(h_counts_), static_cast<void*>(h_result_)}) {
    cudaFreeHost(p);
  }
}

uint64_t VerifyRunner::invalid_requests() const {
  return h_counts_ == nullptr ? 0 : reinterpret_cast<const volatile uint32_t*>(h_counts_)[0];
}

absl::Status VerifyRunner::EnsureInit() {
  if (workspace_ != nullptr) return absl::OkStatus();
  kernels::MlaVerifyWorkspaceConfig config;
  config.device = device_;
  PS_RETURN_IF_CUDA(kernels::CreateMlaVerifyWorkspace(config, &workspace_));
  *device_bytes_ += static_cast<int64_t>(workspace_->bytes);
  const int32_t max_batch = workspace_->max_batch;
  PS_RETURN_IF_CUDA(
      cudaMalloc(reinterpret_cast<void**>(&safe_lengths_), sizeof(int32_t) * max_batch));
  PS_RETURN_IF_CUDA(cudaMalloc(reinterpret_cast<void**>(&invalid_), max_batch));
  PS_RETURN_IF_CUDA(
      cudaMalloc(reinterpret_cast<void**>(&partials_),
                 sizeof(kernels::VerifyCompareResult) * kernels::kVerifyCompareBlocks));
  PS_RETURN_IF_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&h_counts_), 2 * sizeof(uint32_t),
                                  cudaHostAllocMapped));
  h_counts_[0] = h_counts_[1] = 0;
  PS_RETURN_IF_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&d_counts_), h_counts_, 0));
  PS_RETURN_IF_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&h_result_),
                                  sizeof(kernels::VerifyCompareResult), cudaHostAllocMapped));
  PS_RETURN_IF_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&d_result_), h_result_, 0));
  *device_bytes_ +=
      static_cast<int64_t>((sizeof(int32_t) + 1) * max_batch +
                           sizeof(kernels::VerifyCompareResult) * kernels::kVerifyCompareBlocks);
  return absl::OkStatus();
}

cudaError_t VerifyRunner::ReserveForGraphs(StagingBuffer& buffer, size_t bytes) {
  if (bytes <= buffer.bytes()) return cudaSuccess;
  graphs_.Clear();  // they hold the old address (dropping one waits for the stream)
  return buffer.Reserve(bytes);
}

absl::Status VerifyRunner::StageInlineTables(const VerifyJob& job) {
  const size_t table_bytes =
      job.block_table.on_device() ? 0 : sizeof(int32_t) * job.batch * job.block_table.batch_stride;
  const size_t length_bytes = job.cache_seqlens.on_device() ? 0 : sizeof(int32_t) * job.batch;
  if (table_bytes + length_bytes == 0) return absl::OkStatus();
  // Tables first, then the lengths at a 16-byte boundary.
  const size_t lengths_at = (table_bytes + 15) / 16 * 16;
  PS_RETURN_IF_CUDA(ReserveForGraphs(d_table_, lengths_at + length_bytes));
  PS_RETURN_IF_CUDA(h_table_.Reserve(lengths_at + length_bytes));
  auto* host = static_cast<char*>(h_table_.ptr());
  if (table_bytes != 0) std::memcpy(host, job.block_table.host, table_bytes);
  if (length_bytes != 0) std::memcpy(host + lengths_at, job.cache_seqlens.host, length_bytes);
  PS_RETURN_IF_CUDA(cudaMemcpyAsync(d_table_.ptr(), h_table_.ptr(), lengths_at + length_bytes,
                                    cudaMemcpyHostToDevice, stream_));
  return absl::OkStatus();
}

absl::Status VerifyRunner::Run(const VerifyJob& job, VerifyResult* result) {
  PS_RETURN_IF_CUDA(cudaSetDevice(device_));
  if (absl::Status s = EnsureInit(); !s.ok()) return s;
  if (job.shadow) {
    PS_RETURN_IF_CUDA(
        ReserveForGraphs(scratch_, sizeof(__nv_bfloat16) * job.batch * job.s_q * job.h_q * kDimV));
  }
  if (absl::Status s = slot_->AwaitClientEvent(job.ready, job.lifetime); !s.ok()) return s;
  // Inline tables are staged (the copy precedes the graph on the stream); their device address
  // is part of the graph's key.
  if (absl::Status s = StageInlineTables(job); !s.ok()) return s;
  const size_t table_bytes =
      job.block_table.on_device() ? 0 : sizeof(int32_t) * job.batch * job.block_table.batch_stride;
  const size_t lengths_at = (table_bytes + 15) / 16 * 16;
  GraphKey key{};
  key.batch = job.batch;
  key.s_q = job.s_q;
  key.h_q = job.h_q;
  key.path = kernels::ChooseMlaVerifyPath(*workspace_, job.s_q * job.h_q);
  key.scale_bits = Bits(job.softmax_scale);
  key.atol_bits = Bits(job.atol);
  key.rtol_bits = Bits(job.rtol);
  key.q = job.q.device_ptr;
  key.kv = job.kv_cache.device_ptr;
  key.table = job.block_table.on_device() ? job.block_table.device.device_ptr : d_table_.ptr();
  key.lengths = job.cache_seqlens.on_device() ? job.cache_seqlens.device.device_ptr
                                              : static_cast<char*>(d_table_.ptr()) + lengths_at;
  key.out = job.shadow ? scratch_.ptr() : job.out.device_ptr;
  key.lse = job.shadow ? nullptr : job.lse.device_ptr;
  key.compare = job.shadow ? job.compare_to.device_ptr : nullptr;
  key.q_stride = job.q_batch_stride;
  key.kv_stride = job.kv_page_stride;
  key.table_stride = job.block_table.batch_stride;
  key.out_stride = job.shadow ? job.s_q * job.h_q * kDimV : job.out_batch_stride;
  key.lse_stride = job.lse_batch_stride;
  key.compare_stride = job.compare_batch_stride;
  key.num_pages = job.num_pages;
  key.max_pages = job.max_pages;
  result->kernel_path = kernels::MlaVerifyPathName(key.path);

  cudaGraphExec_t exec = nullptr;
  if (Graph* cached = graphs_.Find(key); cached != nullptr) {
    exec = cached->exec;
  } else {
    absl::StatusOr<cudaGraphExec_t> captured = Capture(key, job);
    if (!captured.ok()) return captured.status();
    exec = graphs_.Insert(key, Graph{*captured}).exec;
  }
  PS_RETURN_IF_CUDA(cudaGraphLaunch(exec, stream_));
  if (absl::Status s = slot_->SignalClientEvent(job.done); !s.ok()) return s;
  // Until the deadline (or the caller going away): the stream may still wait for the client's
  // ready event, and then what the graph reads and writes stays held until the GPU is done.
  if (absl::Status s = slot_->FinishOnGpu(
          job.lifetime, {job.q.hold, job.kv_cache.hold, job.block_table.device.hold,
                         job.cache_seqlens.device.hold, job.out.hold, job.lse.hold,
                         job.compare_to.hold, job.ready.hold, job.done.hold});
      !s.ok()) {
    return s;
  }
  const uint32_t invalid = reinterpret_cast<volatile uint32_t*>(h_counts_)[1];
  if (invalid != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        invalid, " of the ", job.batch,
        " requests have a length below s_q or past their page table, or a page-table entry "
        "outside the cache (checked on the GPU)",
        job.shadow ? "; nothing was compared" : "; their outputs are NaN"));
  }
  if (job.shadow) {
    const kernels::VerifyCompareResult r = *h_result_;
    result->shadow = true;
    result->max_abs_error = r.max_abs_error;
    result->rel_l2_error =
        r.sum_sq_ref > 0 ? std::sqrt(r.sum_sq_diff / r.sum_sq_ref) : (r.sum_sq_diff > 0 ? 1 : 0);
    result->compared = r.compared;
    result->mismatched = r.mismatched;
  }
  return absl::OkStatus();
}

absl::StatusOr<cudaGraphExec_t> VerifyRunner::Capture(const GraphKey& key, const VerifyJob& job) {
  kernels::VerifyInputCheckParams check;
  check.cache_seqlens = static_cast<const int32_t*>(key.lengths);
  check.block_table = static_cast<const int32_t*>(key.table);
  check.table_batch_stride = key.table_stride;
  check.batch = key.batch;
  check.s_q = key.s_q;
  check.max_pages = key.max_pages;
  check.num_pages = key.num_pages;
  check.safe_seqlens = safe_lengths_;
  check.invalid = invalid_;
  check.invalid_counts = d_counts_;

  kernels::MlaVerifyParams p;
  p.batch = key.batch;
  p.s_q = key.s_q;
  p.h_q = key.h_q;
  p.softmax_scale = job.softmax_scale;
  p.q = Bf16(job.q);
  p.q_batch_stride = key.q_stride;
  p.q_token_stride = int64_t{key.h_q} * kDimQk;
  p.q_head_stride = kDimQk;
  p.kv_cache = Bf16(job.kv_cache);
  p.kv_page_stride = key.kv_stride;
  p.kv_row_stride = kDimQk;
  p.num_pages = key.num_pages;
  p.block_table = check.block_table;
  p.block_table_batch_stride = key.table_stride;
  p.max_pages = key.max_pages;
  p.cache_seqlens = safe_lengths_;  // invalid requests read nothing
  p.out = static_cast<__nv_bfloat16*>(const_cast<void*>(key.out));
  p.out_batch_stride = key.out_stride;
  p.out_token_stride = int64_t{key.h_q} * kDimV;
  p.out_head_stride = kDimV;
  p.lse = static_cast<float*>(const_cast<void*>(key.lse));
  p.lse_batch_stride = key.lse_stride;
  p.lse_head_stride = key.s_q;
  if (kernels::CheckMlaVerifyParams(p, workspace_) != cudaSuccess) {
    return absl::InternalError(
        "Verify: the request passed validation but not the kernel's own checks (a server bug)");
  }

  kernels::VerifyPoisonParams poison;
  poison.invalid = invalid_;
  poison.batch = key.batch;
  poison.s_q = key.s_q;
  poison.h_q = key.h_q;
  poison.out = p.out;
  poison.out_batch_stride = p.out_batch_stride;
  poison.out_token_stride = p.out_token_stride;
  poison.out_head_stride = p.out_head_stride;
  poison.lse = p.lse;
  poison.lse_batch_stride = p.lse_batch_stride;
  poison.lse_head_stride = p.lse_head_stride;

  kernels::VerifyCompareParams compare;
  if (key.compare != nullptr) {
    compare.a = p.out;
    compare.a_batch_stride = p.out_batch_stride;
    compare.a_token_stride = p.out_token_stride;
    compare.a_head_stride = p.out_head_stride;
    compare.b = static_cast<const __nv_bfloat16*>(key.compare);
    compare.b_batch_stride = key.compare_stride;
    compare.b_token_stride = p.out_token_stride;
    compare.b_head_stride = kDimV;
    compare.batch = key.batch;
    compare.s_q = key.s_q;
    compare.h_q = key.h_q;
    compare.atol = job.atol;
    compare.rtol = job.rtol;
    compare.partials = partials_;
    compare.result = d_result_;
  }

  PS_RETURN_IF_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  cudaError_t error = kernels::LaunchCheckVerifyInputs(check, stream_);
  if (error == cudaSuccess) error = kernels::LaunchMlaVerifyPath(p, key.path, workspace_, stream_);
  if (error == cudaSuccess) error = kernels::LaunchPoisonInvalidVerifyRequests(poison, stream_);
  if (error == cudaSuccess && key.compare != nullptr) {
    error = kernels::LaunchVerifyCompare(compare, stream_);
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
  if (error == cudaSuccess) error = end;
  cudaGraphExec_t exec = nullptr;
  if (error == cudaSuccess) error = cudaGraphInstantiate(&exec, graph, 0);
  if (graph != nullptr) cudaGraphDestroy(graph);
  if (error != cudaSuccess) {
    cudaGetLastError();
    return CudaStatus(error, absl::StrCat("capturing the ", kernels::MlaVerifyPathName(key.path),
                                          " verify graph"));
  }
  return exec;
}

}  // namespace probesidecar::server
