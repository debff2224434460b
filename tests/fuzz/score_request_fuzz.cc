// Fuzz target: Score request validation (PrepareScoreJob) on a serialized ScoreRequest.
//
// The requests resolve against a real BufferRegistry whose "device" allocations are host memory
// of exactly their size (FakeIpcOpener), and two loaded probe sets. When a request is accepted,
// the job is run the way the CPU scorer runs it, over every byte the validation promised: inline
// activations are copied into an exactly sized buffer first, device windows are read and the
// output window written in place. AddressSanitizer then catches any extent, stride or row that
// the validation let through wrongly, and every device window the job uses must lie inside a
// window it leased (its extent recomputed here). Every lease is released by the end of each input.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/safetensors.h"
#include "google/protobuf/stubs/logging.h"
#include "kernels/probe_score/probe_score_cpu.h"
#include "probesidecar/v1/score.pb.h"
#include "server/ipc/ipc_registries.h"
#include "server/probes/probe_registry.h"
#include "server/requests/score_job.h"
#include "tests/fuzz/fake_ipc_opener.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/message_check.h"
#include "tests/fuzz/recording_resolver.h"

namespace {

using probesidecar::server::ScoreJob;

// Handles 'B'... are allocations of 64 bytes, the others of 4096 bytes.
uint64_t AllocationBytes(const probesidecar::server::IpcHandleBytes& handle) {
  return handle[0] == 'B' ? 64 : 4096;
}

std::string Handle(char id) {
  std::string h(64, 'h');
  h[0] = id;
  return h;
}

std::string ProbeSetFile(const char* dtype, int64_t p, int64_t h,
                         std::map<std::string, std::string> metadata) {
  const int element = probesidecar::common::SafetensorsDTypeSize(dtype);
  std::string weight(static_cast<size_t>(p * h * element), '\0');
  std::string bias(static_cast<size_t>(p * element), '\0');
  return probesidecar::common::WriteSafetensors(
      {{"weight", dtype, {p, h}, weight}, {"bias", dtype, {p}, bias}}, metadata);
}

// What every input sees (see the seeds in tests/fuzz/make_seeds.py): session 1 with buffers 1-3
// and events 1 and 2, session 2 with buffer 4 and event 3, and probe sets "p" (F32, P=3, H=8) and
// "h" (BF16, P=2, H=16, sigmoid, thresholds).
struct World {
  World() : opener(AllocationBytes), ipc({0}, &sessions, &opener, {}) {
    const uint64_t s1 = ipc.sessions.Open(1);
    const uint64_t s2 = ipc.sessions.Open(2);
    auto reg = [&](char handle, uint64_t offset, uint64_t bytes, uint64_t session) {
      probesidecar::server::BufferRegistration r;
      r.handle = Handle(handle);
      r.offset_bytes = offset;
      r.byte_size = bytes;
      r.session_id = session;
      FUZZ_CHECK(ipc.buffers.Register(r).ok());
    };
    reg('A', 0, 4096, s1);    // buffer 1: a whole 4096-byte allocation
    reg('A', 100, 1000, s1);  // buffer 2: a window of it at an odd offset
    reg('B', 0, 64, s1);      // buffer 3: a small allocation of its own
    reg('C', 0, 4096, s2);    // buffer 4: another session's
    for (uint64_t session : {s1, s1, s2}) {
      probesidecar::server::EventRegistration e;
      e.handle = Handle('E');
      e.session_id = session;
      FUZZ_CHECK(ipc.events.Register(e).ok());
    }
    FUZZ_CHECK(probes.LoadFromBytes("p", ProbeSetFile("F32", 3, 8, {}), false).ok());
    FUZZ_CHECK(
        probes
            .LoadFromBytes("h",
                           ProbeSetFile("BF16", 2, 16,
                                        {{"activation", "sigmoid"}, {"thresholds", "[0.5, null]"}}),
                           false)
            .ok());
  }
  probesidecar::fuzz::FakeIpcOpener opener;
  probesidecar::server::SessionTable sessions;
  probesidecar::server::IpcRegistries ipc;
  probesidecar::server::ProbeRegistry probes{
      "", probesidecar::server::ProbeSetLimits{},
      [](probesidecar::server::ProbeSet&) { return absl::OkStatus(); }};
};

// Scores the job on the CPU over exactly the bytes validation promised.
void RunOnCpu(const ScoreJob& job, const probesidecar::v1::ScoreRequest& request,
              const probesidecar::fuzz::RecordingResolver& leased) {
  const probesidecar::server::Tensor2D& x = job.activations;
  const int element = probesidecar::common::DTypeSize(x.dtype);
  const uint64_t extent =
      (static_cast<uint64_t>(x.rows - 1) * x.row_stride + x.cols) * static_cast<uint64_t>(element);
  std::unique_ptr<char[]> inline_copy;
  const void* activations = x.device.device_ptr;
  if (x.on_device()) leased.CheckLeased(activations, extent);
  if (!x.on_device()) {
    // The request's bytes may hold more than the extent (up to rows * row_stride); copy only what
    // was promised, so that a read past it is a heap overflow.
    FUZZ_CHECK(request.activations().data().size() >= extent);
    inline_copy = std::make_unique<char[]>(extent);
    std::memcpy(inline_copy.get(), x.host, extent);
    activations = inline_copy.get();
  }
  std::vector<int32_t> rows(static_cast<size_t>(job.num_rows));
  if (job.rows_on_device()) {
    // Device rows are checked on the GPU; read them, then keep them in range for the scorer.
    leased.CheckLeased(job.device_rows.device.device_ptr, rows.size() * sizeof(int32_t));
    std::memcpy(rows.data(), job.device_rows.device.device_ptr, rows.size() * sizeof(int32_t));
    for (int32_t& r : rows) r = static_cast<int32_t>(static_cast<uint32_t>(r) % x.rows);
  } else {
    for (size_t i = 0; i < rows.size(); ++i) {
      FUZZ_CHECK(job.rows[i] >= 0 && job.rows[i] < x.rows);
      rows[i] = job.rows[i];
    }
  }
  const probesidecar::server::ProbeSet& set = *job.probe_set;
  probesidecar::kernels::ProbeScoreCpuParams params;
  params.x = activations;
  params.x_dtype = x.dtype;
  params.x_row_stride = x.row_stride;
  params.rows = rows.data();
  params.num_rows = job.num_rows;
  params.weight = set.weight.data();
  params.bias = set.bias.data();
  params.hidden = set.hidden;
  params.num_probes = set.num_probes;
  params.activation = set.activation;
  if (job.host_out != nullptr) {
    params.out = job.host_out;
    params.out_row_stride = set.num_probes;
  } else {
    FUZZ_CHECK(job.device_out.on_device());
    FUZZ_CHECK(job.device_out.rows == job.num_rows && job.device_out.cols == set.num_probes);
    params.out = static_cast<float*>(job.device_out.device.device_ptr);
    params.out_row_stride = job.device_out.row_stride;
    leased.CheckLeased(
        params.out,
        (static_cast<uint64_t>(job.num_rows - 1) * params.out_row_stride + set.num_probes) *
            sizeof(float));
  }
  probesidecar::kernels::ScoreProbesCpu(params, 0, job.num_rows);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // protobuf logs every string field that is not UTF-8; the parse result is what matters here.
  static const bool quiet = (google::protobuf::SetLogHandler(nullptr), true);
  (void)quiet;
  static World* world = new World();  // lives for the whole run, like the server's
  probesidecar::v1::ScoreRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;

  probesidecar::server::ScoreLimits limits;
  limits.max_rows = 64;
  limits.max_message_bytes = 1 << 16;
  std::string scores;
  probesidecar::fuzz::RecordingResolver leased(&world->ipc);
  {
    absl::StatusOr<ScoreJob> job =
        PrepareScoreJob(request, world->probes, &leased, limits, &scores);
    if (!job.ok()) {
      probesidecar::fuzz::CheckRefusalMessage(job.status());
      FUZZ_CHECK(job.status().code() != absl::StatusCode::kFailedPrecondition);
    } else {
      FUZZ_CHECK(job->probe_set != nullptr);
      FUZZ_CHECK(job->num_rows >= 1 && job->num_rows <= static_cast<int32_t>(limits.max_rows));
      FUZZ_CHECK(job->activations.cols == job->probe_set->hidden);
      if (job->host_out != nullptr) {
        FUZZ_CHECK(scores.size() ==
                   static_cast<size_t>(job->num_rows) * job->probe_set->num_probes * sizeof(float));
      }
      FUZZ_CHECK((job->ready.event != nullptr) == (request.ready_event() != 0));
      FUZZ_CHECK((job->done.event != nullptr) == (request.done_event() != 0));
      RunOnCpu(*job, request, leased);
    }
  }
  // Every lease ended with the job.
  for (const probesidecar::server::BufferListing& info : world->ipc.buffers.List()) {
    FUZZ_CHECK(info.in_flight == 0);
  }
  return 0;
}
