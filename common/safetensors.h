// A strict reader (and a small writer) for the safetensors format.
//
// Layout: 8-byte little-endian header length N, N bytes of JSON header, then the data section.
// The header maps tensor names to {"dtype", "shape", "data_offsets": [begin, end)} (offsets
// relative to the data section) plus an optional "__metadata__" object of string values.
// Anything malformed, truncated, oversized, overlapping, misaligned or hostile is refused with a
// message that names the problem; a refused file leaves nothing behind.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace probesidecar::common {

struct SafetensorsLimits {
  uint64_t max_file_bytes = uint64_t{1} << 30;
  uint64_t max_header_bytes = uint64_t{16} << 20;
  int max_tensors = 4096;
  int max_rank = 8;
  int max_json_depth = 8;
};

struct SafetensorsTensor {
  std::string name;
  std::string dtype;  // as written: "F32", "F16", "BF16", "I32", ...
  std::vector<int64_t> shape;
  uint64_t data_begin = 0;  // bytes, relative to the data section
  uint64_t data_end = 0;
};

class SafetensorsFile {
 public:
  // Parses a whole file held in memory (takes ownership of the bytes).
  static absl::StatusOr<SafetensorsFile> Parse(std::string bytes, const SafetensorsLimits& limits);
  // Reads and parses a file; the size limit is checked before anything is read.
  static absl::StatusOr<SafetensorsFile> Read(const std::string& path,
                                              const SafetensorsLimits& limits);
  // The same from a file already open for reading (the caller keeps and closes `fd`); `path`
  // names it in messages.
  static absl::StatusOr<SafetensorsFile> ReadFrom(int fd, const std::string& path,
                                                  const SafetensorsLimits& limits);

  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // nullptr when absent.
  const SafetensorsTensor* Find(absl::string_view name) const;
  // The tensor's bytes (little-endian elements).
  absl::Span<const uint8_t> Data(const SafetensorsTensor& tensor) const;
  uint64_t file_bytes() const { return bytes_.size(); }

 private:
  std::string bytes_;
  uint64_t data_start_ = 0;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A string from a file, quoted for an error message: control characters escaped, long ones cut
// at 96 bytes (on a UTF-8 boundary) with the full length noted.
std::string QuoteForMessage(absl::string_view text);

// A JSON parse error (nlohmann's what()) for a message: the "[json.exception...] " prefix dropped
// and the input it echoes ("last read: '...'", escaped only below 0x20 by the parser) quoted with
// QuoteForMessage like every other piece of a file.
std::string JsonErrorForMessage(absl::string_view what);

// Bytes per element of a safetensors dtype name, 0 when unknown.
int SafetensorsDTypeSize(absl::string_view dtype);

struct SafetensorsTensorToWrite {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::string data;  // little-endian element bytes, exactly prod(shape) * size
};

// Serialises tensors ordered like the reference implementation (larger element types first,
// then by name; offsets stay aligned) with the header padded to a multiple of 8 bytes.
std::string WriteSafetensors(const std::vector<SafetensorsTensorToWrite>& tensors,
                             const std::map<std::string, std::string>& metadata);

}  // namespace probesidecar::common
