// The CPU reference of the tap's write and close kernels: the exact slot and counter semantics of
// tap_write.h on host memory (every pointer in the params is a host pointer). The tests' oracle,
// never production code. Plain C++.
#pragma once

#include "kernels/tap_write/tap_write.h"

namespace probesidecar::kernels {

// False (and nothing written) for params TapWriteParamsValid refuses.
bool TapWriteRef(const TapWriteParams& params);
// False (and nothing written) for params TapCloseParamsValid refuses.
bool TapCloseRef(const TapCloseParams& params);

}  // namespace probesidecar::kernels
