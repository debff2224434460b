// Probe weights on the device: uploaded once, when a probe set is loaded, in the padded layout of
// every dtype's kernels.
#include <new>
#include <vector>

#include "kernels/blocks/tensor_map.h"
#include "kernels/probe_score/probe_score.h"
#include "kernels/probe_score/probe_score_weight_terms.h"

namespace probesidecar::kernels {
namespace {

using probe_score_detail::kHiddenPad;
using probe_score_detail::kProbePad;

constexpr int64_t RoundUp(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

// The tensor map gather_wgmma's warp-specialised tile reads W through: the 16-bit plane at
// `plane` as a 2-D tensor [p_pad, h_pad], boxes of kWsWeightBoxCols x kWsWeightBoxRows.
cudaError_t EncodeWeightMap(const void* plane, CUtensorMapDataType type, int64_t p_pad,
                            int64_t h_pad, CUtensorMap* map) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(h_pad), static_cast<cuuint64_t>(p_pad)};
  const cuuint64_t byte_strides[1] = {static_cast<cuuint64_t>(h_pad) * 2};
  const cuuint32_t box[2] = {probe_score_detail::kWsWeightBoxCols,
                             probe_score_detail::kWsWeightBoxRows};
  return blocks::EncodeSwizzled128TensorMap(map, type, 2, plane, dims, byte_strides, box);
}

}  // namespace

cudaError_t CreateProbeWeights(const float* weight, const float* bias, int32_t num_probes,
                               int32_t hidden, ProbePrecision precision, ProbeWeights* out) {
  if (weight == nullptr || bias == nullptr || out == nullptr || num_probes < 1 || hidden < 1) {
    return cudaErrorInvalidValue;
  }
  *out = ProbeWeights{};
  const int64_t p_pad = RoundUp(num_probes, kProbePad), h_pad = RoundUp(hidden, kHiddenPad);
  const int64_t plane = p_pad * h_pad;
  const int terms = WeightTerms(precision);
  const size_t bias_bytes = RoundUp(static_cast<int64_t>(num_probes) * 4, 256);
  const size_t w32_bytes = static_cast<size_t>(plane * 4);
  const size_t w16_bytes = static_cast<size_t>(terms * plane * 2);
  const size_t total = bias_bytes + w32_bytes + 2 * w16_bytes;
  // Layout: bias | W fp32 | W fp16 terms | W bf16 terms, each plane [p_pad, h_pad] with zero
  // padding (the tensor-core kernels read whole tiles of W without bounds checks).
  const float half_scale = precision == ProbePrecision::kExact
                               ? HalfTermScale(weight, static_cast<int64_t>(num_probes) * hidden)
                               : 1.0f;
  std::vector<float> w32;
  std::vector<uint16_t> w16, wb16;
  try {
    w32.assign(static_cast<size_t>(plane), 0.0f);
    w16.assign(static_cast<size_t>(terms * plane), 0);
    wb16.assign(static_cast<size_t>(terms * plane), 0);
  } catch (const std::bad_alloc&) {
    return cudaErrorMemoryAllocation;
  }
  for (int64_t p = 0; p < num_probes; ++p) {
    for (int64_t h = 0; h < hidden; ++h) {
      const float v = weight[p * hidden + h];
      const int64_t i = p * h_pad + h;
      w32[i] = v;
      if (terms == 1) {
        w16[i] = common::FloatToHalf(v);
        wb16[i] = common::FloatToBf16(v);
      } else {
        SplitHalfTerms(v * half_scale, &w16[i], &w16[i + plane], &w16[i + 2 * plane]);
        SplitBf16Terms(v, &wb16[i], &wb16[i + plane], &wb16[i + 2 * plane]);
      }
    }
  }
  char* storage = nullptr;
  cudaError_t err = cudaMalloc(reinterpret_cast<void**>(&storage), total);
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
    cudaFree(storage);  // the copy's error is the one to report
    return err;
  }
  out->num_probes = num_probes;
  out->hidden = hidden;
  out->precision = precision;
  out->bias = reinterpret_cast<const float*>(bias_d);
  out->weight[static_cast<int>(common::DType::kFloat32)] = w32_d;
  out->weight[static_cast<int>(common::DType::kFloat16)] = w16_d;
  out->weight[static_cast<int>(common::DType::kBFloat16)] = wb16_d;
  out->term_scale[static_cast<int>(common::DType::kFloat16)] = half_scale;
  out->term_stride = plane;
  out->storage = storage;
  out->storage_bytes = total;
  if (terms == 1) {
    // Once per probe set, so that no launch encodes one. A driver without the encoder leaves
    // the maps unready (and its workspaces never dispatch gather_wgmma).
    const struct {
      common::DType dtype;
      CUtensorMapDataType type;
    } maps[] = {{common::DType::kFloat16, CU_TENSOR_MAP_DATA_TYPE_FLOAT16},
                {common::DType::kBFloat16, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16}};
    for (const auto& m : maps) {
      const int d = static_cast<int>(m.dtype);
      const cudaError_t encoded =
          EncodeWeightMap(out->weight[d], m.type, p_pad, h_pad, &out->weight_map[d]);
      if (encoded == cudaErrorNotSupported) continue;
      if (encoded != cudaSuccess) {
        DestroyProbeWeights(out);
        return encoded;
      }
      out->weight_map_ready[d] = true;
    }
  }
  return cudaSuccess;
}

cudaError_t DestroyProbeWeights(ProbeWeights* weights) {
  if (weights == nullptr) return cudaErrorInvalidValue;
  cudaError_t err = cudaSuccess;
  if (weights->storage != nullptr) err = cudaFree(weights->storage);
  *weights = ProbeWeights{};
  return err;
}

}  // namespace probesidecar::kernels
