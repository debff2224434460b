// Fuzz target: the strict safetensors reader (probe-set files, LoadProbeSet's inline bytes).
//
// Properties: a refusal is a clean one-line message; an accepted file's tensors tile its data
// section exactly, each holds prod(shape) * element size bytes that can all be read, names are
// found, and writing the file back out and reading it again gives the same tensors and metadata.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/safetensors.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/message_check.h"

namespace {

using probesidecar::common::SafetensorsFile;
using probesidecar::common::SafetensorsLimits;
using probesidecar::common::SafetensorsTensor;

// Smaller than the server's limits so that an input cannot ask for gigabytes; every check is the
// same code either way.
SafetensorsLimits FuzzLimits() {
  SafetensorsLimits limits;
  limits.max_file_bytes = 1 << 20;
  limits.max_header_bytes = 1 << 16;
  limits.max_tensors = 64;
  return limits;
}

uint64_t ReadAll(absl::Span<const uint8_t> bytes) {
  uint64_t sum = 0;
  for (uint8_t b : bytes) sum += b;
  return sum;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const SafetensorsLimits limits = FuzzLimits();
  absl::StatusOr<SafetensorsFile> file =
      SafetensorsFile::Parse(std::string(reinterpret_cast<const char*>(data), size), limits);
  if (!file.ok()) {
    probesidecar::fuzz::CheckRefusalMessage(file.status());
    return 0;
  }
  FUZZ_CHECK(file->file_bytes() == size);
  FUZZ_CHECK(file->tensors().size() <= static_cast<size_t>(limits.max_tensors));
  uint64_t data_bytes = 0;
  std::vector<probesidecar::common::SafetensorsTensorToWrite> rewrite;
  for (const SafetensorsTensor& t : file->tensors()) {
    const int element = probesidecar::common::SafetensorsDTypeSize(t.dtype);
    FUZZ_CHECK(element > 0);
    FUZZ_CHECK(t.shape.size() <= static_cast<size_t>(limits.max_rank));
    uint64_t elements = 1;
    for (int64_t d : t.shape) {
      FUZZ_CHECK(d >= 0);
      elements *= static_cast<uint64_t>(d);  // no overflow: the bytes are in the file
    }
    const absl::Span<const uint8_t> bytes = file->Data(t);
    FUZZ_CHECK(bytes.size() == elements * static_cast<uint64_t>(element));
    FUZZ_CHECK(t.data_end - t.data_begin == bytes.size());
    FUZZ_CHECK(t.data_begin % static_cast<uint64_t>(element) == 0);
    (void)ReadAll(bytes);
    FUZZ_CHECK(file->Find(t.name) == &t);
    data_bytes += bytes.size();
    rewrite.push_back({t.name, t.dtype, t.shape, std::string(bytes.begin(), bytes.end())});
  }
  // Tiling: the tensors' bytes add up to the data section, which ends the file.
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | data[i];
  FUZZ_CHECK(data_bytes == size - 8 - header_bytes);

  // Round trip through the writer.
  const std::string written = probesidecar::common::WriteSafetensors(rewrite, file->metadata());
  absl::StatusOr<SafetensorsFile> again = SafetensorsFile::Parse(written, limits);
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(again->metadata() == file->metadata());
  FUZZ_CHECK(again->tensors().size() == file->tensors().size());
  for (size_t i = 0; i < file->tensors().size(); ++i) {
    const SafetensorsTensor& a = file->tensors()[i];
    const SafetensorsTensor& b = again->tensors()[i];
    FUZZ_CHECK(a.name == b.name && a.dtype == b.dtype && a.shape == b.shape);
    const absl::Span<const uint8_t> da = file->Data(a), db = again->Data(b);
    FUZZ_CHECK(da.size() == db.size() && std::equal(da.begin(), da.end(), db.begin()));
  }
  return 0;
}
