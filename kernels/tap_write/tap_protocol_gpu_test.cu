// The tap protocol across languages on the GPU (docs/tap-protocol.md), C++ half.
//
//   tap_protocol_gpu_test [gtest flags]   the scripted wrapped-ring scenarios (every dtype, rings
//                                         with and without device scores) written by the C++
//                                         write and close kernels: every ring byte at every
//                                         checkpoint against the CPU reference, and every window
//                                         element read by the C++ reader against the model.
//                                         Exits 77 (skipped) without a CUDA device.
//   tap_protocol_gpu_test write SCRIPT DIR [SCRIPT DIR...]  the same kernels run each SCRIPT and
//                                         save the rings and the model's windows in its DIR, for
//                                         the Python reader (tests/python/test_gpu_tap_protocol.py)
//   tap_protocol_gpu_test read SCRIPT DIR   the C++ reader on rings the Python writer (Triton)
//                                         saved in DIR; also layout, scenario, run-ref
//                                         (tap_protocol_script.h)
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "gtest/gtest.h"
#include "kernels/blocks/gpu_test_main.h"
#include "kernels/tap_write/tap_protocol_script.h"
#include "kernels/tap_write/tap_write.h"

namespace probesidecar::kernels::tap_protocol {
namespace {

// Device allocations freed on every path.
class DeviceMemory {
 public:
  ~DeviceMemory() {
    for (void* p : pointers_) cudaFree(p);
  }
  cudaError_t Alloc(size_t bytes, void** out) {
    const cudaError_t e = cudaMalloc(out, bytes == 0 ? 1 : bytes);
    if (e == cudaSuccess) pointers_.push_back(*out);
    return e;
  }

 private:
  std::vector<void*> pointers_;
};

#define RETURN_IF_CUDA(call)                                           \
  do {                                                                 \
    const cudaError_t error_ = (call);                                 \
    if (error_ != cudaSuccess) {                                       \
      *error = std::string(#call) + ": " + cudaGetErrorString(error_); \
      return false;                                                    \
    }                                                                  \
  } while (0)

// The script with LaunchTapWrite and LaunchTapClose on a device ring poisoned like the
// reference's; at each checkpoint the sidecar's scores are copied into the window's output (as
// the sidecar writes them) and the ring is saved; the ring at the end last.
bool RunOnGpu(const Script& s, std::vector<std::vector<uint8_t>>* rings, std::string* error) {
  const TapRingLayout layout = s.Layout();
  DeviceMemory memory;
  cudaStream_t stream = nullptr;
  RETURN_IF_CUDA(PrepareTapKernels());
  RETURN_IF_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  struct StreamGuard {
    cudaStream_t s;
    ~StreamGuard() { cudaStreamDestroy(s); }
  } guard{stream};
  void* ring = nullptr;
  RETURN_IF_CUDA(memory.Alloc(layout.total_bytes, &ring));
  std::vector<uint8_t> host = PoisonedRing(layout);
  RETURN_IF_CUDA(cudaMemcpy(ring, host.data(), host.size(), cudaMemcpyHostToDevice));
  auto* base = static_cast<uint8_t*>(ring);
  // Every write's source rows and device row count, uploaded before the first launch.
  std::vector<const void*> sources;
  std::vector<const int32_t*> counts32;
  std::vector<const int64_t*> counts64;
  int64_t write = 0;
  for (const Op& op : s.ops) {
    if (op.kind != Op::Kind::kWrite) continue;
    const std::vector<uint8_t> rows = SourceRows(s, op, write++);
    void* src = nullptr;
    RETURN_IF_CUDA(memory.Alloc(rows.size(), &src));
    RETURN_IF_CUDA(cudaMemcpy(src, rows.data(), rows.size(), cudaMemcpyHostToDevice));
    sources.push_back(src);
    void* count = nullptr;
    RETURN_IF_CUDA(memory.Alloc(8, &count));
    const auto count32 = static_cast<int32_t>(op.count);
    RETURN_IF_CUDA(cudaMemcpy(count,
                              op.count_kind == 1 ? static_cast<const void*>(&count32)
                                                 : static_cast<const void*>(&op.count),
                              op.count_kind == 1 ? 4 : 8, cudaMemcpyHostToDevice));
    counts32.push_back(op.count_kind == 1 ? static_cast<const int32_t*>(count) : nullptr);
    counts64.push_back(op.count_kind == 2 ? static_cast<const int64_t*>(count) : nullptr);
  }
  write = 0;
  int64_t checkpoint = 0;
  rings->clear();
  for (const Op& op : s.ops) {
    if (op.kind == Op::Kind::kWrite) {
      RETURN_IF_CUDA(LaunchTapWrite(
          WriteParams(s, op, base, sources[write], counts32[write], counts64[write]), stream));
      ++write;
    } else if (op.kind == Op::Kind::kClose) {
      TapCloseParams c{reinterpret_cast<int64_t*>(base + layout.meta), op.half, op.next_base,
                       op.next_limit};
      c.record_writes = op.record;
      RETURN_IF_CUDA(LaunchTapClose(c, stream));
    } else {
      const TapWindowParts parts = MakeTapWindowParts(layout, op.half, op.steps);
      const std::vector<float> scores = CheckpointScores(layout, op.steps, checkpoint++);
      if (parts.scores >= 0) {
        RETURN_IF_CUDA(cudaMemcpyAsync(base + parts.scores, scores.data(),
                                       scores.size() * sizeof(float), cudaMemcpyHostToDevice,
                                       stream));
      }
      RETURN_IF_CUDA(cudaStreamSynchronize(stream));
      RETURN_IF_CUDA(cudaMemcpy(host.data(), ring, host.size(), cudaMemcpyDeviceToHost));
      rings->push_back(host);
    }
  }
  RETURN_IF_CUDA(cudaStreamSynchronize(stream));
  RETURN_IF_CUDA(cudaMemcpy(host.data(), ring, host.size(), cudaMemcpyDeviceToHost));
  rings->push_back(host);
  RETURN_IF_CUDA(cudaGetLastError());
  return true;
}

// Every ring of a GPU run against the reference's, every window read against the model.
void ExpectRunMatches(const Script& s, const std::vector<std::vector<uint8_t>>& rings) {
  const TapRingLayout layout = s.Layout();
  const std::vector<std::vector<uint8_t>> reference = RunReference(s);
  const std::vector<WindowRead> model = Model(s);
  ASSERT_EQ(rings.size(), reference.size());
  for (size_t i = 0; i < rings.size(); ++i) {
    EXPECT_EQ(CompareRings(reference[i], rings[i], layout, "ring " + std::to_string(i)), "");
  }
  size_t checkpoint = 0;
  for (const Op& op : s.ops) {
    if (op.kind != Op::Kind::kRead) continue;
    const WindowRead got = ReadWindow(rings[checkpoint].data(), layout, op.half, op.steps);
    EXPECT_EQ(CompareWindow(model[checkpoint], got, static_cast<int64_t>(checkpoint)), "");
    ++checkpoint;
  }
  EXPECT_EQ(checkpoint + 1, rings.size());
}

struct Shape {
  int32_t window, max_batch, hidden, probes;
};

class TapProtocolGpuTest : public ::testing::TestWithParam<common::DType> {};

// A wrapped ring (more writes than a window holds: the spare slot; closes alternating halves, a
// diverted window) on shapes whose rows copy in 16-, 8-, 4- and 2-byte units and in several
// blocks per row.
TEST_P(TapProtocolGpuTest, WrappedRingsMatchTheReferenceAndReadAsTheModelSays) {
  const common::DType dtype = GetParam();
  for (const Shape& shape :
       {Shape{3, 4, 40, 2}, Shape{2, 5, 33, 3}, Shape{4, 3, 3000, 1}, Shape{2, 1, 1, 1}}) {
    for (const bool device_scores : {true, false}) {
      SCOPED_TRACE("K " + std::to_string(shape.window) + " max_batch " +
                   std::to_string(shape.max_batch) + " H " + std::to_string(shape.hidden) +
                   (device_scores ? " device scores" : " host ring"));
      const Script s = WrappedScenario(shape.window, shape.max_batch, shape.hidden, shape.probes,
                                       dtype, device_scores);
      std::vector<std::vector<uint8_t>> rings;
      std::string error;
      ASSERT_TRUE(RunOnGpu(s, &rings, &error)) << error;
      ExpectRunMatches(s, rings);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, TapProtocolGpuTest,
                         ::testing::Values(common::DType::kBFloat16, common::DType::kFloat16,
                                           common::DType::kFloat32),
                         [](const ::testing::TestParamInfo<common::DType>& info) {
                           return std::string(common::DTypeName(info.param));
                         });

// `write SCRIPT DIR [SCRIPT DIR...]`: 0, 1 (a CUDA error), 2 (usage), 77 (no CUDA device).
int WriteCommand(int argc, char** argv) {
  if (argc < 4 || argc % 2 != 0) {
    std::fprintf(stderr, "usage: tap_protocol_gpu_test write SCRIPT DIR [SCRIPT DIR...]\n");
    return 2;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "tap_protocol_gpu_test write: no CUDA device\n");
    return 77;
  }
  for (int i = 2; i < argc; i += 2) {
    std::vector<uint8_t> text;
    Script s;
    std::string error;
    if (!ReadFile(argv[i], &text, &error) ||
        !ParseScript(std::string(text.begin(), text.end()), &s, &error)) {
      std::fprintf(stderr, "%s: %s\n", argv[i], error.c_str());
      return 2;
    }
    std::vector<std::vector<uint8_t>> rings;
    if (!RunOnGpu(s, &rings, &error)) {
      std::fprintf(stderr, "tap_protocol_gpu_test write %s: %s\n", argv[i], error.c_str());
      return 1;
    }
    const std::string dir = argv[i + 1];
    if (!WriteFile(dir + "/rings.bin", JoinRings(rings), &error) ||
        !WriteFile(dir + "/expected.bin", ExpectedBytes(Model(s)), &error)) {
      std::fprintf(stderr, "%s\n", error.c_str());
      return 1;
    }
    std::printf("tap protocol: %d windows written by the C++ kernels into %s\n", s.Checkpoints(),
                dir.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace probesidecar::kernels::tap_protocol

int main(int argc, char** argv) {
  namespace tp = probesidecar::kernels::tap_protocol;
  if (argc >= 2 && std::strcmp(argv[1], "write") == 0) return tp::WriteCommand(argc, argv);
  if (const int status = tp::RunTapProtocolCommand(argc, argv); status >= 0) return status;
  return probesidecar::kernels::gpu_test::RunGpuTests(argc, argv);
}
