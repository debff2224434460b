// Fuzz target: Verify request validation (PrepareVerifyJob) on a serialized VerifyRequest.
//
// The requests resolve against a real BufferRegistry whose "device" allocations are host memory
// of exactly their size (FakeIpcOpener). When a request is accepted, every leased tensor is touched
// at the first and last byte of every slice the kernels would read or write, and when the page
// table and lengths are both inline, every page they name is touched as the kernel would gather
// it: AddressSanitizer catches any extent, stride or table entry the validation let through
// wrongly, and every slice must lie inside a window it leased (the extent recomputed here).
// Alignment the kernels rely on (16-byte bf16 rows, 4-byte floats) is checked too.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "google/protobuf/stubs/logging.h"
#include "probesidecar/v1/verify.pb.h"
#include "server/ipc/ipc_registries.h"
#include "server/requests/verify_job.h"
#include "tests/fuzz/fake_ipc_opener.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/message_check.h"
#include "tests/fuzz/recording_resolver.h"

namespace {

using probesidecar::server::BufferLease;
using probesidecar::server::VerifyJob;

constexpr int64_t kPageSize = 64, kDimQk = 576, kDimV = 512;

// Handle 'A': 4 MiB (q, kv_cache, out and compare_to windows); 'B': 4 KiB (tables, lengths, lse).
uint64_t AllocationBytes(const probesidecar::server::IpcHandleBytes& handle) {
  return handle[0] == 'A' ? uint64_t{4} << 20 : 4096;
}

// What every input sees (see the seeds in tests/fuzz/make_seeds.py): session 1 with buffer 1 =
// all of 'A', buffer 2 = 'A' from offset 16, buffer 3 = all of 'B', buffer 4 = 'B' from offset 4,
// and events 1 and 2; session 2 with event 3.
struct World {
  World() : opener(AllocationBytes), ipc({0}, &sessions, &opener, {}) {
    const uint64_t s1 = ipc.sessions.Open(1);
    const uint64_t s2 = ipc.sessions.Open(2);
    auto reg = [&](char id, uint64_t offset, uint64_t bytes) {
      probesidecar::server::BufferRegistration r;
      r.handle = std::string(1, id) + std::string(63, 'h');
      r.offset_bytes = offset;
      r.byte_size = bytes;
      r.session_id = s1;
      FUZZ_CHECK(ipc.buffers.Register(r).ok());
    };
    reg('A', 0, uint64_t{4} << 20);
    reg('A', 16, (uint64_t{4} << 20) - 16);
    reg('B', 0, 4096);
    reg('B', 4, 4092);
    for (uint64_t session : {s1, s1, s2}) {
      probesidecar::server::EventRegistration e;
      e.handle = std::string(64, 'e');
      e.session_id = session;
      FUZZ_CHECK(ipc.events.Register(e).ok());
    }
  }
  probesidecar::fuzz::FakeIpcOpener opener;
  probesidecar::server::SessionTable sessions;
  probesidecar::server::IpcRegistries ipc;
};

volatile char sink;

const probesidecar::fuzz::RecordingResolver* leased = nullptr;  // this input's

// Reads (or writes) the first and last byte of each of `n` slices of `slice_bytes` bytes,
// `stride_bytes` apart, after checking that all of them lie in a window validation leased.
void Touch(const BufferLease& lease, int64_t n, int64_t slice_bytes, int64_t stride_bytes,
           bool write) {
  FUZZ_CHECK(lease.device_ptr != nullptr);
  leased->CheckLeased(lease.device_ptr,
                      static_cast<uint64_t>((n - 1) * stride_bytes + slice_bytes));
  char* base = static_cast<char*>(lease.device_ptr);
  for (int64_t i = 0; i < n; ++i) {
    char* first = base + i * stride_bytes;
    char* last = first + slice_bytes - 1;
    if (write) {
      *first = 1;
      *last = 2;
    } else {
      sink = *first;
      sink = *last;
    }
  }
}

bool Aligned(const BufferLease& lease, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(lease.device_ptr) % bytes == 0;
}

int32_t Int32At(const probesidecar::server::Int32Tensor& t, int64_t index) {
  if (t.on_device()) {
    leased->CheckLeased(static_cast<const int32_t*>(t.device.device_ptr) + index, sizeof(int32_t));
  }
  int32_t v = 0;
  const void* p =
      t.on_device()
          ? static_cast<const void*>(static_cast<const int32_t*>(t.device.device_ptr) + index)
          : static_cast<const void*>(t.host + index);
  std::memcpy(&v, p, sizeof(v));
  return v;
}

void CheckJob(const VerifyJob& job) {
  FUZZ_CHECK(job.batch >= 1 && job.s_q >= 1 && job.h_q >= 16);
  const int64_t b = job.batch, s_q = job.s_q, h_q = job.h_q;
  FUZZ_CHECK(job.q_batch_stride % 8 == 0 && Aligned(job.q, 16));
  Touch(job.q, b, s_q * h_q * kDimQk * 2, job.q_batch_stride * 2, false);
  FUZZ_CHECK(job.num_pages >= 1 && job.kv_page_stride % 8 == 0 && Aligned(job.kv_cache, 16));
  Touch(job.kv_cache, job.num_pages, kPageSize * kDimQk * 2, job.kv_page_stride * 2, false);
  FUZZ_CHECK(job.max_pages >= 1 && job.block_table.batch_stride >= job.max_pages);
  for (int64_t i = 0; i < b; ++i) {
    const int32_t length = Int32At(job.cache_seqlens, i);
    const int32_t last_page =
        Int32At(job.block_table, i * job.block_table.batch_stride + job.max_pages - 1);
    (void)last_page;
    if (job.cache_seqlens.on_device() || job.block_table.on_device()) continue;  // GPU-checked
    FUZZ_CHECK(length >= job.s_q && length <= int64_t{job.max_pages} * kPageSize);
    for (int64_t k = 0; k < (length + kPageSize - 1) / kPageSize; ++k) {
      const int32_t page = Int32At(job.block_table, i * job.block_table.batch_stride + k);
      FUZZ_CHECK(page >= 0 && page < job.num_pages);
      BufferLease one = job.kv_cache;
      one.device_ptr = static_cast<char*>(job.kv_cache.device_ptr) + page * job.kv_page_stride * 2;
      Touch(one, 1, kPageSize * kDimQk * 2, 0, false);
    }
  }
  if (job.shadow) {
    FUZZ_CHECK(job.out.device_ptr == nullptr && job.lse.device_ptr == nullptr);
    FUZZ_CHECK(job.compare_batch_stride % 8 == 0 && Aligned(job.compare_to, 16));
    Touch(job.compare_to, b, s_q * h_q * kDimV * 2, job.compare_batch_stride * 2, false);
    FUZZ_CHECK(job.atol >= 0 && job.rtol >= 0);
  } else {
    FUZZ_CHECK(job.out_batch_stride % 8 == 0 && Aligned(job.out, 16));
    Touch(job.out, b, s_q * h_q * kDimV * 2, job.out_batch_stride * 2, true);
    if (job.lse.device_ptr != nullptr) {
      FUZZ_CHECK(Aligned(job.lse, 4));
      Touch(job.lse, b, h_q * s_q * 4, job.lse_batch_stride * 4, true);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // protobuf logs every string field that is not UTF-8; the parse result is what matters here.
  static const bool quiet = (google::protobuf::SetLogHandler(nullptr), true);
  (void)quiet;
  static World* world = new World();  // lives for the whole run, like the server's
  probesidecar::v1::VerifyRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  probesidecar::fuzz::RecordingResolver recording(&world->ipc);
  leased = &recording;
  {
    absl::StatusOr<VerifyJob> job =
        PrepareVerifyJob(request, &recording, probesidecar::server::VerifyLimits{});
    if (!job.ok()) {
      probesidecar::fuzz::CheckRefusalMessage(job.status());
    } else {
      CheckJob(*job);
      FUZZ_CHECK((job->ready.event != nullptr) == (request.ready_event() != 0));
      FUZZ_CHECK((job->done.event != nullptr) == (request.done_event() != 0));
    }
  }
  for (const probesidecar::server::BufferListing& info : world->ipc.buffers.List()) {
    FUZZ_CHECK(info.in_flight == 0);
  }
  return 0;
}
