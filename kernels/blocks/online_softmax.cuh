// The online softmax of attention kernels, in the log2 domain (scores pre-multiplied by
// softmax_scale * log2(e), so that exp2 serves): a running max and sum per query row, updated one
// block of keys at a time.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

namespace probesidecar::kernels::blocks {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// One step for a row whose running max is `running_max` when a block of keys with maximum
// `block_max` arrives (both -inf while no key is seen).
struct OnlineSoftmaxStep {
  float max;      // the new running max
  float offset;   // what the block's scores are exponentiated against: max, or 0 while it is
                  // -inf (so that exp2 stays finite and masked scores give exactly 0)
  float rescale;  // 2^(running_max - offset): multiplies what was summed against running_max
};
__device__ __forceinline__ OnlineSoftmaxStep NextOnlineSoftmaxStep(float running_max,
                                                                   float block_max) {
  const float m_new = fmaxf(running_max, block_max);
  const float offset = m_new == -INFINITY ? 0.0f : m_new;
  return {m_new, offset, exp2f(running_max - offset)};
}

}  // namespace probesidecar::kernels::blocks
