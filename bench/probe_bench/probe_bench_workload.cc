#include "bench/probe_bench/probe_bench_workload.h"

#include <cmath>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "client/cpp/cuda_buffer.h"
#include "common/dtype.h"
#include "common/safetensors.h"

namespace probesidecar::bench {

std::string RandomBf16(size_t elements, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::string bytes(elements * 2, '\0');
  for (size_t i = 0; i < elements; ++i) {
    const uint16_t v = common::FloatToBf16(normal(rng));
    std::memcpy(&bytes[i * 2], &v, 2);
  }
  return bytes;
}

std::string ProbeSetName(int probes) { return absl::StrCat("bench_p", probes); }

absl::Status LoadProbeSets(client::Client& client, const std::vector<int>& probes, int hidden,
                           uint32_t seed) {
  for (int p : probes) {
    const std::string w = RandomBf16(static_cast<size_t>(p) * hidden, seed + 2 * p);
    const std::string b = RandomBf16(p, seed + 2 * p + 1);
    const std::string file = common::WriteSafetensors(
        {{"weight", "BF16", {p, hidden}, w}, {"bias", "BF16", {p}, b}}, {});
    absl::StatusOr<v1::ProbeSetInfo> loaded =
        client.LoadProbeSetFromBytes(ProbeSetName(p), file, {.replace = true});
    if (!loaded.ok()) {
      return absl::Status(loaded.status().code(),
                          absl::StrCat("LoadProbeSet: ", loaded.status().message()));
    }
  }
  return absl::OkStatus();
}

bool IsBad(int64_t i, double fraction) {
  return fraction > 0 && std::floor((i + 1) * fraction) > std::floor(i * fraction);
}

Workload MakeWorkload(const WorkloadSpec& spec) {
  Workload w;
  w.bad_fraction = spec.bad_fraction;
  const std::string probe_set = ProbeSetName(spec.probes);
  std::mt19937 rng(spec.seed);
  // Eight row sets, rotated, so that no two consecutive calls read the same rows.
  for (int set = 0; set < 8; ++set) {
    v1::ScoreRequest& r = w.ipc_requests.emplace_back();
    *r.mutable_activations() =
        client::BufferTensor(v1::DTYPE_BFLOAT16, spec.tokens, spec.hidden, spec.buffer_id);
    for (int i = 0; i < spec.rows; ++i) r.add_rows(static_cast<int32_t>(rng() % spec.tokens));
    r.set_probe_set(probe_set);
    r.set_session_id(spec.session_id);
  }
  v1::ScoreRequest& inline_request = w.inline_requests.emplace_back();
  *inline_request.mutable_activations() =
      client::InlineTensor(v1::DTYPE_BFLOAT16, spec.rows, spec.hidden,
                           spec.host_activations->substr(0, size_t{2} * spec.rows * spec.hidden));
  for (int i = 0; i < spec.rows; ++i) inline_request.add_rows(i);
  inline_request.set_probe_set(probe_set);
  if (spec.bad_fraction > 0) {
    for (auto [good, bad] :
         {std::pair{&w.ipc_requests, &w.ipc_bad}, std::pair{&w.inline_requests, &w.inline_bad}}) {
      *bad = *good;
      for (v1::ScoreRequest& r : *bad) r.set_probe_set(kMissingProbeSet);
    }
  }
  w.echo.set_payload(std::string(w.ipc_requests[0].ByteSizeLong(), 'x'));
  w.echo.set_response_bytes(static_cast<uint32_t>(spec.rows * spec.probes * 4 + 16));
  return w;
}

}  // namespace probesidecar::bench
