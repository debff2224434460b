// make-demo-probe-set OUT.safetensors
//
// Writes the bundled demo probe set: H = 4096, P = 4, bf16 weight [4, 4096] and bias [4],
// probe_names ["probe_a", "probe_b", "probe_c", "probe_d"], activation "sigmoid", thresholds
// [0.5, 0.5, 0.9, null]. The output is byte-identical on every run and every platform: the
// numbers come from a fixed-seed splitmix64 and exact IEEE arithmetic only (no std::
// distributions, whose output differs between standard libraries, and no libm calls, whose last
// bits differ between C libraries).
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/safetensors.h"

namespace probesidecar::server {
namespace {

constexpr int64_t kHidden = 4096;
constexpr int64_t kProbes = 4;
constexpr uint64_t kSeed = 0x5eedda7a0000d3e0ull;
// 1/sqrt(H) for H = 4096: keeps each probe's logit O(1) for unit-variance hidden states.
constexpr double kWeightScale = 1.0 / 64.0;
constexpr double kBiasScale = 0.01;

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}

  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

  // Uniform in [0, 1), exactly representable: 53 random bits times 2^-53.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

  // Approximately standard normal (Irwin-Hall: the sum of 12 uniforms minus 6 has mean 0 and
  // variance 1). Only additions of exact values, so every platform gets the same bits, which a
  // Box-Muller transform through log/cos would not guarantee.
  double Normal() {
    double sum = 0.0;
    for (int i = 0; i < 12; ++i) sum += Uniform();
    return sum - 6.0;
  }

 private:
  uint64_t state_;
};

std::string Bf16Bytes(const std::vector<double>& values) {
  std::string out(values.size() * 2, '\0');
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t bits = common::FloatToBf16(static_cast<float>(values[i]));
    out[2 * i] = static_cast<char>(bits & 0xff);
    out[2 * i + 1] = static_cast<char>(bits >> 8);
  }
  return out;
}

std::string DemoProbeSetBytes() {
  SplitMix64 rng(kSeed);
  std::vector<double> weight(kProbes * kHidden);
  for (double& w : weight) w = rng.Normal() * kWeightScale;
  std::vector<double> bias(kProbes);
  for (double& b : bias) b = rng.Normal() * kBiasScale;

  std::vector<common::SafetensorsTensorToWrite> tensors;
  tensors.push_back({"weight", "BF16", {kProbes, kHidden}, Bf16Bytes(weight)});
  tensors.push_back({"bias", "BF16", {kProbes}, Bf16Bytes(bias)});
  const std::map<std::string, std::string> metadata = {
      {"probe_names", R"(["probe_a","probe_b","probe_c","probe_d"])"},
      {"activation", "sigmoid"},
      {"thresholds", "[0.5,0.5,0.9,null]"},
  };
  return common::WriteSafetensors(tensors, metadata);
}

int Main(int argc, char** argv) {
  if (argc != 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::fprintf(stderr,
                 "usage: make-demo-probe-set OUT.safetensors\n"
                 "Writes the bundled demo probe set (H=4096, P=4, bf16, sigmoid).\n");
    return 2;
  }
  const std::string out_path = argv[1];
  const std::string bytes = DemoProbeSetBytes();
  // Written beside the target and renamed, so that nothing ever sees a partial file.
  const std::string tmp_path = out_path + ".tmp." + std::to_string(getpid());
  {
    std::ofstream out(tmp_path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) {
      std::fprintf(stderr, "make-demo-probe-set: cannot write %s: %s\n", tmp_path.c_str(),
                   std::strerror(errno));
      std::remove(tmp_path.c_str());
      return 1;
    }
  }
  if (std::rename(tmp_path.c_str(), out_path.c_str()) != 0) {
    std::fprintf(stderr, "make-demo-probe-set: cannot rename %s to %s: %s\n", tmp_path.c_str(),
                 out_path.c_str(), std::strerror(errno));
    std::remove(tmp_path.c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace probesidecar::server

int main(int argc, char** argv) { return probesidecar::server::Main(argc, argv); }
