// Helpers shared by the probe-scoring kernel families and not by other kernels (those are in
// kernels/blocks). Device side: the activation flag, per-dtype element access, streaming loads.
// Host side: the visitors that turn a plan's runtime dtype and configuration index into a template
// instantiation. Included only by the kernel headers (probe_score_fused_cuda.cuh,
// probe_score_fused_tc.cuh, probe_score_gather_gemm.cuh, probe_score_wgmma_sm90a.cuh).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "common/dtype.h"
#include "kernels/probe_score/probe_score_activation.h"
#include "kernels/probe_score/probe_score_params.h"

namespace probesidecar::kernels::probe_score_detail {

// Whether the params' activation code (Activation as int) asks for a sigmoid: the flag the
// epilogue of kernels/blocks/epilogue.cuh takes.
__device__ __forceinline__ bool IsSigmoid(int activation) {
  return activation == static_cast<int>(Activation::kSigmoid);
}

template <typename T>
struct Elem;
template <>
struct Elem<float> {
  static constexpr int kVec = 4;  // elements per 16-byte load
  __device__ __forceinline__ static float Load(const float* p) { return __ldg(p); }
  // Elements 4q .. 4q + 3 of a raw chunk.
  __device__ __forceinline__ static void UnpackQuad(const uint4& v, int /*q*/, float (&f)[4]) {
    f[0] = __uint_as_float(v.x);
    f[1] = __uint_as_float(v.y);
    f[2] = __uint_as_float(v.z);
    f[3] = __uint_as_float(v.w);
  }
  __device__ __forceinline__ static void Unpack(const uint4& v, float (&f)[kVec]) {
    f[0] = __uint_as_float(v.x);
    f[1] = __uint_as_float(v.y);
    f[2] = __uint_as_float(v.z);
    f[3] = __uint_as_float(v.w);
  }
};
template <>
struct Elem<__nv_bfloat16> {
  static constexpr int kVec = 8;
  __device__ __forceinline__ static float Load(const __nv_bfloat16* p) {
    return __uint_as_float(static_cast<uint32_t>(__ldg(reinterpret_cast<const uint16_t*>(p)))
                           << 16);
  }
  __device__ __forceinline__ static void UnpackQuad(const uint4& v, int q, float (&f)[4]) {
    const uint32_t lo = q == 0 ? v.x : v.z, hi = q == 0 ? v.y : v.w;
    f[0] = __uint_as_float(lo << 16);
    f[1] = __uint_as_float(lo & 0xffff0000u);
    f[2] = __uint_as_float(hi << 16);
    f[3] = __uint_as_float(hi & 0xffff0000u);
  }
  __device__ __forceinline__ static void Unpack(const uint4& v, float (&f)[kVec]) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = __uint_as_float(w[i] << 16);
      f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  }
};
template <>
struct Elem<__half> {
  static constexpr int kVec = 8;
  __device__ __forceinline__ static float Load(const __half* p) {
    return __half2float(__ushort_as_half(__ldg(reinterpret_cast<const uint16_t*>(p))));
  }
  __device__ __forceinline__ static void UnpackQuad(const uint4& v, int q, float (&f)[4]) {
    const uint32_t lo = q == 0 ? v.x : v.z, hi = q == 0 ? v.y : v.w;
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&lo));
    const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&hi));
    f[0] = a.x;
    f[1] = a.y;
    f[2] = b.x;
    f[3] = b.y;
  }
  __device__ __forceinline__ static void Unpack(const uint4& v, float (&f)[kVec]) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 t = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
      f[2 * i] = t.x;
      f[2 * i + 1] = t.y;
    }
  }
};

// 16-byte streaming load: activations are read once, so keep them out of L1.
__device__ __forceinline__ uint4 LdStream16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// ------------------------------------------------------------------------------------------
// Host side: from a plan's runtime choices (dtype, configuration index) to the instantiation.

template <typename T>
struct ElementTag {
  using type = T;
};

// fn(ElementTag<T>{}) for the CUDA element type T of `dtype`; `fallback` for an unknown dtype.
template <typename R, typename Fn>
R VisitElementType(common::DType dtype, R fallback, Fn&& fn) {
  switch (dtype) {
    case common::DType::kFloat32:
      return fn(ElementTag<float>{});
    case common::DType::kFloat16:
      return fn(ElementTag<__half>{});
    case common::DType::kBFloat16:
      return fn(ElementTag<__nv_bfloat16>{});
  }
  return fallback;
}

template <typename R, typename Fn, int... kIndex>
R VisitIndexIn(int index, R fallback, Fn& fn, std::integer_sequence<int, kIndex...>) {
  R result = fallback;
  (void)((index == kIndex ? (result = fn(std::integral_constant<int, kIndex>{}), true) : false) ||
         ...);
  return result;
}

// fn(std::integral_constant<int, I>{}) for the I in [0, kCount) equal to `index`; `fallback` when
// none is.
template <int kCount, typename R, typename Fn>
R VisitIndex(int index, R fallback, Fn&& fn) {
  return VisitIndexIn(index, fallback, fn, std::make_integer_sequence<int, kCount>{});
}

}  // namespace probesidecar::kernels::probe_score_detail
