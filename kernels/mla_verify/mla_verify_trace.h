// In-kernel timestamp trace of the sm_90a MLA verify tile kernels: per warpgroup of every block,
// when it starts a step and when it begins and ends each wait (for a page's TMA boxes, for Q, for
// the other warpgroup, for its own wgmma), so that the idle cycles per page are measured rather
// than guessed. Compiled in only with -DPROBESIDECAR_MLA_TRACE=ON (CMake), which defines
// PROBESIDECAR_MLA_TRACE=1 for the sm_90a translation unit; otherwise the recorder calls compile to
// nothing and SetMlaVerifyTraceBuffer answers cudaErrorNotSupported. Benchmarks only: a traced
// build is not a production build.
//
// Buffer layout (uint32, device): for block b (blockIdx.y * gridDim.x + blockIdx.x) and warpgroup
// w, the region at (b * 2 + w) * events_per_warpgroup * 2 holds events_per_warpgroup pairs:
//   pair 0:      {pairs used (events + 2), SM id}
//   pair 1:      {%globaltimer (ns, low 32 bits) at the block's start, and at its end}
//   pair k >= 2: {SM cycles since the block's start (clock64, low 32 bits), event << 24 | step}
// where step counts the kernel's steps (pages, or pairs of pages) from 0 (low 24 bits). Blocks
// past max_blocks record nothing. bench/mla_verify/trace_report.py reads it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace probesidecar::kernels {

// Event codes (stable: trace_report.py names them by number).
enum class MlaTraceEvent : uint32_t {
  kStep = 0,         // a step (a page, or a pair of pages) begins
  kWaitKvBegin = 1,  // waiting for a TMA box of a page (recorded only when it had not landed)
  kWaitKvEnd = 2,
  kWaitQBegin = 3,  // waiting for the request's Q tile
  kWaitQEnd = 4,
  kWaitPeerBegin = 5,  // waiting on a named barrier for the other warpgroup
  kWaitPeerEnd = 6,
  kWaitMmaBegin = 7,  // waiting for this warpgroup's own wgmma to complete
  kWaitMmaEnd = 8,
  kIssueLoad = 9,       // this thread issued TMA loads (step = the step that issues them)
  kEpilogueBegin = 10,  // a finished request's rows written
  kEpilogueEnd = 11,
  kDone = 12,         // the block leaves its loop
  kGridWaitEnd = 13,  // the plan kernel's writes are visible (programmatic dependency)
};

// Whether this build records the trace.
bool MlaVerifyTraceCompiledIn();

// Points the sm_90a tile kernels at `buffer` (device, at least max_blocks * 2 *
// events_per_warpgroup * 2 uint32) for the launches that follow; nullptr stops recording. Not
// thread-safe: one benchmark thread sets it between launches.
cudaError_t SetMlaVerifyTraceBuffer(uint32_t* buffer, int32_t max_blocks,
                                    int32_t events_per_warpgroup);

}  // namespace probesidecar::kernels
