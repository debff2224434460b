#include "kernels/tap_write/tap_write_ref.h"

#include <algorithm>
#include <cstring>

namespace probesidecar::kernels {

bool TapWriteRef(const TapWriteParams& p) {
  if (!TapWriteParamsValid(p)) return false;
  int64_t* meta = p.meta;
  const int64_t slot = meta[kTapMetaNextSlot];
  const int64_t limit = meta[kTapMetaLimit];
  const int64_t target = slot < limit ? slot : p.overflow_slot;
  const int64_t element = common::DTypeSize(p.dtype);
  const auto* src = static_cast<const char*>(p.src);
  auto* slots = static_cast<char*>(p.slots);
  for (int64_t row = 0; row < p.n; ++row) {
    std::memcpy(slots + (target * p.max_batch + row) * p.hidden * element,
                src + row * p.src_row_stride * element, static_cast<size_t>(p.hidden * element));
  }
  int64_t count = p.n;
  if (p.num_rows32 != nullptr) count = *p.num_rows32;
  if (p.num_rows64 != nullptr) count = *p.num_rows64;
  p.counts[target] = static_cast<int32_t>(std::clamp<int64_t>(count, 0, p.n));
  meta[kTapMetaNextSlot] = std::min(slot + 1, limit);
  meta[kTapMetaWrites] += 1;
  meta[kTapMetaTicket] = 0;
  return true;
}

bool TapCloseRef(const TapCloseParams& p) {
  if (!TapCloseParamsValid(p)) return false;
  if (p.record_writes) p.meta[kTapMetaHalfWrites + p.half] = p.meta[kTapMetaWrites];
  p.meta[kTapMetaNextSlot] = p.next_base;
  p.meta[kTapMetaLimit] = p.next_limit;
  p.meta[kTapMetaWrites] = 0;
  return true;
}

}  // namespace probesidecar::kernels
