// Row buckets: the row counts that the CUDA executor captures graphs for.
#pragma once

#include <cstdint>

namespace probesidecar::server {

// Row counts that graphs are captured for: 1, 2, 4 ... 1024, then multiples of 1024 up to 8192,
// then multiples of 8192. A request of R rows replays the graph of the smallest bucket >= R,
// so padding costs at most 2x (1.125x past 8192) and the number of graphs stays small.
inline int32_t RowBucket(int32_t rows) {
  if (rows <= 1) return 1;
  if (rows <= 1024) {
    int32_t bucket = 1;
    while (bucket < rows) bucket <<= 1;
    return bucket;
  }
  const int32_t step = rows <= 8192 ? 1024 : 8192;
  return static_cast<int32_t>((static_cast<int64_t>(rows) + step - 1) / step * step);
}

}  // namespace probesidecar::server
