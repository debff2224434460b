#include "common/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <limits>
#include <new>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace probesidecar::common {
namespace {

using Json = nlohmann::json;

constexpr char kMetadataKey[] = "__metadata__";
constexpr uint64_t kLengthFieldBytes = 8;

struct DTypeInfo {
  absl::string_view name;
  int size;  // bytes per element
};

// In the reference implementation's enum order (increasing alignment). The writer orders tensors
// by descending position in this table, then by name, exactly as the reference does, so that
// every tensor's offset is a multiple of its element size.
constexpr DTypeInfo kDTypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
    {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
    {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8},
};

int DTypeRank(absl::string_view dtype) {
  for (size_t i = 0; i < std::size(kDTypes); ++i) {
    if (kDTypes[i].name == dtype) return static_cast<int>(i);
  }
  return -1;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::Status Invalid(absl::string_view message) { return absl::InvalidArgumentError(message); }

// Byte offset of the first byte that is not well-formed UTF-8 (overlong forms, surrogates and
// code points past U+10FFFF included), or npos.
size_t FindInvalidUtf8(absl::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t length;
    unsigned char lo = 0x80, hi = 0xbf;  // allowed range of the second byte
    if (c >= 0xc2 && c <= 0xdf) {
      length = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      length = 3;
      if (c == 0xe0) lo = 0xa0;  // overlong
      if (c == 0xed) hi = 0x9f;  // surrogates
    } else if (c >= 0xf0 && c <= 0xf4) {
      length = 4;
      if (c == 0xf0) lo = 0x90;  // overlong
      if (c == 0xf4) hi = 0x8f;  // past U+10FFFF
    } else {
      return i;
    }
    if (n - i < length) return i;
    if (s[i + 1] < lo || s[i + 1] > hi) return i;
    for (size_t k = 2; k < length; ++k) {
      if ((s[i + k] & 0xc0) != 0x80) return i;
    }
    i += length;
  }
  return absl::string_view::npos;
}

// Thrown by the parser callback to stop parsing at the first hostile construct; caught in
// ParseHeaderJson and never beyond it.
struct HeaderRefusal {
  absl::Status status;
};

// nlohmann keeps the last of duplicate keys and nests without bound; this callback refuses both
// as soon as they appear, and stops counting tensors at the limit instead of building a huge DOM.
class HeaderGuard {
 public:
  explicit HeaderGuard(const SafetensorsLimits& limits) : limits_(limits) {}

  bool operator()(int /*depth*/, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        levels_.push_back(Level{event == Json::parse_event_t::object_start, {}, {}});
        if (static_cast<int64_t>(levels_.size()) > limits_.max_json_depth) {
          throw HeaderRefusal{Invalid(absl::StrCat("header JSON is nested deeper than ",
                                                   limits_.max_json_depth, " levels", Where()))};
        }
        break;
      case Json::parse_event_t::object_end:
      case Json::parse_event_t::array_end:
        if (!levels_.empty()) levels_.pop_back();
        break;
      case Json::parse_event_t::key: {
        if (levels_.empty() || !levels_.back().is_object) break;
        const std::string* key = parsed.get_ptr<const std::string*>();
        if (key == nullptr) break;
        Level& level = levels_.back();
        if (!level.keys.insert(*key).second) {
          throw HeaderRefusal{
              Invalid(absl::StrCat("header has a duplicate key ", QuoteForMessage(*key), Where()))};
        }
        level.current_key = *key;
        if (levels_.size() == 1 && *key != kMetadataKey) {
          ++tensors_;
          if (tensors_ > limits_.max_tensors) {
            throw HeaderRefusal{absl::ResourceExhaustedError(
                absl::StrCat("header has more than ", limits_.max_tensors, " tensors"))};
          }
        }
        break;
      }
      case Json::parse_event_t::value:
        break;
    }
    return true;
  }

 private:
  struct Level {
    bool is_object;
    std::set<std::string, std::less<>> keys;
    std::string current_key;
  };

  // " in tensor "w"" / " in "__metadata__"" for messages; empty at the top level.
  std::string Where() const {
    if (levels_.size() < 2 || !levels_.front().is_object) return "";
    const std::string& outer = levels_.front().current_key;
    if (outer == kMetadataKey) return absl::StrCat(" in ", QuoteForMessage(outer));
    return absl::StrCat(" in tensor ", QuoteForMessage(outer));
  }

  const SafetensorsLimits& limits_;
  std::vector<Level> levels_;
  int64_t tensors_ = 0;
};

absl::StatusOr<Json> ParseHeaderJson(absl::string_view header, const SafetensorsLimits& limits) {
  HeaderGuard guard(limits);
  try {
    Json::parser_callback_t callback = [&guard](int depth, Json::parse_event_t event,
                                                Json& parsed) {
      return guard(depth, event, parsed);
    };
    return Json::parse(header.begin(), header.end(), callback, /*allow_exceptions=*/true,
                       /*ignore_comments=*/false);
  } catch (const HeaderRefusal& refusal) {
    return refusal.status;
  } catch (const Json::parse_error& e) {
    return Invalid(absl::StrCat("header is not valid JSON: ", JsonErrorForMessage(e.what())));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of memory while parsing the header");
  } catch (const std::exception& e) {
    return Invalid(absl::StrCat("header is not valid JSON: ", e.what()));
  } catch (...) {
    return absl::InternalError("unexpected exception while parsing the header");
  }
}

// A JSON integer as uint64; refuses floats, negatives and other types with `what` in the message.
absl::StatusOr<uint64_t> NonNegativeInteger(const Json& value, const std::string& what) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_number_integer()) {
    const int64_t v = value.get<int64_t>();
    if (v < 0) return Invalid(absl::StrCat(what, " is negative (", v, ")"));
    return static_cast<uint64_t>(v);
  }
  if (value.is_number_float()) return Invalid(absl::StrCat(what, " is not an integer"));
  return Invalid(absl::StrCat(what, " is not an integer (", value.type_name(), ")"));
}

absl::StatusOr<SafetensorsTensor> ParseTensorEntry(const std::string& name, const Json& entry,
                                                   uint64_t data_bytes,
                                                   const SafetensorsLimits& limits) {
  const std::string tensor = absl::StrCat("tensor ", QuoteForMessage(name));
  if (!entry.is_object()) {
    return Invalid(absl::StrCat(tensor, " is not an object (", entry.type_name(), ")"));
  }
  for (const auto& [key, value] : entry.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      return Invalid(absl::StrCat(tensor, " has an unexpected field ", QuoteForMessage(key),
                                  " (expected only \"dtype\", \"shape\", \"data_offsets\")"));
    }
  }
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(field)) {
      return Invalid(absl::StrCat(tensor, " is missing the field \"", field, "\""));
    }
  }

  SafetensorsTensor out;
  out.name = name;

  const Json& dtype = entry["dtype"];
  if (!dtype.is_string()) {
    return Invalid(absl::StrCat(tensor, ": dtype is not a string (", dtype.type_name(), ")"));
  }
  out.dtype = dtype.get<std::string>();
  const int elem_size = SafetensorsDTypeSize(out.dtype);
  if (elem_size == 0) {
    return Invalid(absl::StrCat(tensor, " has an unknown dtype ", QuoteForMessage(out.dtype)));
  }

  const Json& shape = entry["shape"];
  if (!shape.is_array()) {
    return Invalid(absl::StrCat(tensor, ": shape is not an array (", shape.type_name(), ")"));
  }
  if (shape.size() > static_cast<size_t>(std::max(limits.max_rank, 0))) {
    return absl::ResourceExhaustedError(
        absl::StrCat(tensor, " has rank ", shape.size(), ", over the limit of ", limits.max_rank));
  }
  uint64_t elements = 1;
  bool overflow = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    absl::StatusOr<uint64_t> dim =
        NonNegativeInteger(shape[i], absl::StrCat(tensor, ": shape[", i, "]"));
    if (!dim.ok()) return dim.status();
    if (*dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Invalid(absl::StrCat(tensor, ": shape[", i, "] = ", *dim, " is too large"));
    }
    out.shape.push_back(static_cast<int64_t>(*dim));
    overflow |= __builtin_mul_overflow(elements, *dim, &elements);
  }
  uint64_t expected_bytes = 0;
  overflow |= __builtin_mul_overflow(elements, static_cast<uint64_t>(elem_size), &expected_bytes);

  const Json& offsets = entry["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2) {
    return Invalid(absl::StrCat(tensor, ": data_offsets is not an array [begin, end]"));
  }
  absl::StatusOr<uint64_t> begin = NonNegativeInteger(offsets[0], tensor + ": data_offsets[0]");
  if (!begin.ok()) return begin.status();
  absl::StatusOr<uint64_t> end = NonNegativeInteger(offsets[1], tensor + ": data_offsets[1]");
  if (!end.ok()) return end.status();
  out.data_begin = *begin;
  out.data_end = *end;
  const std::string range = absl::StrCat("[", out.data_begin, ", ", out.data_end, "]");
  if (out.data_begin > out.data_end) {
    return Invalid(absl::StrCat(tensor, ": data_offsets ", range, " begin after end"));
  }
  if (out.data_end > data_bytes) {
    return Invalid(absl::StrCat(tensor, ": data_offsets ", range, " run past the end of the ",
                                data_bytes, "-byte data section"));
  }
  if (overflow) {
    return Invalid(absl::StrCat(tensor, ": shape ", ShapeString(out.shape), " of ", out.dtype,
                                " overflows 64-bit byte counts"));
  }
  if (out.data_end - out.data_begin != expected_bytes) {
    return Invalid(absl::StrCat(
        tensor, ": data_offsets ", range, " hold ", out.data_end - out.data_begin,
        " bytes but shape ", ShapeString(out.shape), " of ", out.dtype, " needs ", expected_bytes));
  }
  if (out.data_begin % static_cast<uint64_t>(elem_size) != 0) {
    return Invalid(absl::StrCat(tensor, ": data offset ", out.data_begin, " is misaligned for ",
                                out.dtype, " (", elem_size, "-byte elements)"));
  }
  return out;
}

absl::Status ParseMetadata(const Json& value, std::map<std::string, std::string>& metadata) {
  if (!value.is_object()) {
    return Invalid(absl::StrCat("\"__metadata__\" is not an object (", value.type_name(), ")"));
  }
  for (const auto& [key, v] : value.items()) {
    if (!v.is_string()) {
      return Invalid(absl::StrCat("\"__metadata__\" value of ", QuoteForMessage(key),
                                  " is not a string (", v.type_name(), ")"));
    }
    metadata.emplace(key, v.get<std::string>());
  }
  return absl::OkStatus();
}

// The safetensors spec requires the tensors to tile the data section exactly: no overlap, no
// hole, no trailing bytes. Zero-byte tensors may sit at any boundary.
absl::Status CheckCoverage(const std::vector<SafetensorsTensor>& tensors, uint64_t data_bytes) {
  std::vector<const SafetensorsTensor*> order;
  order.reserve(tensors.size());
  for (const SafetensorsTensor& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const SafetensorsTensor* a, const SafetensorsTensor* b) {
    return std::tie(a->data_begin, a->data_end, a->name) <
           std::tie(b->data_begin, b->data_end, b->name);
  });
  uint64_t covered = 0;
  const SafetensorsTensor* previous = nullptr;
  for (const SafetensorsTensor* t : order) {
    if (t->data_begin < covered) {
      return Invalid(absl::StrCat("tensors ", QuoteForMessage(previous->name), " and ",
                                  QuoteForMessage(t->name), " overlap in the data section (bytes ",
                                  t->data_begin, " to ", std::min(covered, t->data_end), ")"));
    }
    if (t->data_begin > covered) {
      return Invalid(absl::StrCat("the data section has a hole: bytes ", covered, " to ",
                                  t->data_begin, " (before tensor ", QuoteForMessage(t->name),
                                  ") belong to no tensor"));
    }
    if (t->data_end > covered || previous == nullptr) previous = t;
    covered = t->data_end;
  }
  if (covered != data_bytes) {
    return Invalid(absl::StrCat("the data section has ", data_bytes - covered,
                                " trailing bytes (from offset ", covered,
                                ") that belong to no tensor"));
  }
  return absl::OkStatus();
}

absl::Status ErrnoStatus(int error, const std::string& path, absl::string_view action) {
  const std::string message =
      absl::StrCat(QuoteForMessage(path), ": cannot ", action, ": ", strerror(error));
  switch (error) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case ELOOP:
    case ENAMETOOLONG:
    case EISDIR:
      return absl::InvalidArgumentError(message);
    case ENOMEM:
    case EMFILE:
    case ENFILE:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::UnknownError(message);
  }
}

class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

}  // namespace

// Names come from the (untrusted) file: quote them, escape control characters and cut long ones
// so that messages stay one readable line.
std::string QuoteForMessage(absl::string_view text) {
  constexpr size_t kMaxBytes = 96;
  std::string out = "\"";
  size_t i = 0;
  for (; i < text.size() && i < kMaxBytes; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    // C1 controls (U+0080..U+009F: C2 80..C2 9F, e.g. U+009B, a terminal's CSI), line and
    // paragraph separators and the bidirectional overrides and isolates (U+2028..U+202E,
    // U+2066..U+2069: E2 80 A8..AE, E2 81 A6..A9) can rewrite how a log line reads: escaped.
    const unsigned char c1 = i + 1 < text.size() ? static_cast<unsigned char>(text[i + 1]) : 0;
    const unsigned char c2 = i + 2 < text.size() ? static_cast<unsigned char>(text[i + 2]) : 0;
    uint32_t escaped = 0;
    if (c == 0xc2 && c1 >= 0x80 && c1 <= 0x9f) {
      escaped = c1;
    } else if (c == 0xe2 && c1 == 0x80 && c2 >= 0xa8 && c2 <= 0xae) {
      escaped = 0x2000 + (c2 - 0x80);
    } else if (c == 0xe2 && c1 == 0x81 && c2 >= 0xa6 && c2 <= 0xa9) {
      escaped = 0x2040 + (c2 - 0x80);
    }
    if (escaped != 0) {
      absl::StrAppendFormat(&out, "\\u%04x", escaped);
      i += escaped < 0x100 ? 1 : 2;
      continue;
    }
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c < 0x20 || c == 0x7f) {
      constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xf]);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  if (i < text.size()) {
    // Do not end inside a UTF-8 sequence.
    while (!out.empty() && (static_cast<unsigned char>(out.back()) & 0xc0) == 0x80) out.pop_back();
    if (!out.empty() && static_cast<unsigned char>(out.back()) >= 0xc0) out.pop_back();
    absl::StrAppend(&out, "...(", text.size(), " bytes)");
  }
  out.push_back('"');
  return out;
}

std::string JsonErrorForMessage(absl::string_view what) {
  // what is "[json.exception.parse_error.101] parse error at line 1, column 7: ...; last read:
  // '<the token's bytes>'".
  if (const size_t pos = what.find("] "); pos != absl::string_view::npos) {
    what.remove_prefix(pos + 2);
  }
  constexpr absl::string_view kLastRead = "; last read: '";
  const size_t pos = what.find(kLastRead);
  if (pos == absl::string_view::npos) return std::string(what);
  absl::string_view token = what.substr(pos + kLastRead.size());
  if (!token.empty() && token.back() == '\'') token.remove_suffix(1);
  return absl::StrCat(what.substr(0, pos), "; last read: ", QuoteForMessage(token));
}

int SafetensorsDTypeSize(absl::string_view dtype) {
  const int rank = DTypeRank(dtype);
  return rank < 0 ? 0 : kDTypes[rank].size;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Parse(std::string bytes,
                                                       const SafetensorsLimits& limits) {
  const uint64_t file_bytes = bytes.size();
  if (file_bytes > limits.max_file_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("file is ", file_bytes, " bytes, over the limit of ", limits.max_file_bytes));
  }
  if (file_bytes < kLengthFieldBytes) {
    return Invalid(absl::StrCat("file is ", file_bytes,
                                " bytes, shorter than the 8-byte header length field"));
  }
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) {
    header_bytes = (header_bytes << 8) | static_cast<unsigned char>(bytes[i]);
  }
  if (header_bytes == 0) return Invalid("header length is 0");
  // Past the end first: a length field that does not fit the file is malformed (e.g. a file that
  // is not safetensors at all), not a header that is merely over the limit.
  if (header_bytes > file_bytes - kLengthFieldBytes) {
    return Invalid(absl::StrCat("header length ", header_bytes, " runs past the end of the file (",
                                file_bytes - kLengthFieldBytes, " bytes follow the length field)"));
  }
  if (header_bytes > limits.max_header_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("header length ", header_bytes,
                                                     " is over the limit of ",
                                                     limits.max_header_bytes, " bytes"));
  }
  const absl::string_view header(bytes.data() + kLengthFieldBytes, header_bytes);
  if (const size_t bad = FindInvalidUtf8(header); bad != absl::string_view::npos) {
    return Invalid(absl::StrCat("header is not valid UTF-8 (at header byte ", bad, ")"));
  }
  // nlohmann's lexer takes a NUL byte for the end of input and would accept "{}\0garbage"; no
  // valid header has one (JSON strings must escape it).
  if (const size_t nul = header.find('\0'); nul != absl::string_view::npos) {
    return Invalid(absl::StrCat("header contains a NUL byte (at header byte ", nul, ")"));
  }
  absl::StatusOr<Json> json = ParseHeaderJson(header, limits);
  if (!json.ok()) return json.status();
  if (!json->is_object()) {
    return Invalid(absl::StrCat("header is not a JSON object (", json->type_name(), ")"));
  }

  SafetensorsFile file;
  file.data_start_ = kLengthFieldBytes + header_bytes;
  const uint64_t data_bytes = file_bytes - file.data_start_;
  const size_t num_tensors = json->size() - (json->contains(std::string(kMetadataKey)) ? 1 : 0);
  if (num_tensors > static_cast<size_t>(std::max(limits.max_tensors, 0))) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "header has ", num_tensors, " tensors, over the limit of ", limits.max_tensors));
  }
  file.tensors_.reserve(num_tensors);
  // Json objects iterate in key order, so tensors_ is sorted by name.
  for (const auto& [key, value] : json->items()) {
    if (key == kMetadataKey) {
      if (absl::Status status = ParseMetadata(value, file.metadata_); !status.ok()) return status;
      continue;
    }
    absl::StatusOr<SafetensorsTensor> tensor = ParseTensorEntry(key, value, data_bytes, limits);
    if (!tensor.ok()) return tensor.status();
    file.tensors_.push_back(*std::move(tensor));
  }
  if (absl::Status status = CheckCoverage(file.tensors_, data_bytes); !status.ok()) return status;
  file.bytes_ = std::move(bytes);
  return file;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Read(const std::string& path,
                                                      const SafetensorsLimits& limits) {
  if (path.empty()) return Invalid("empty path");
  if (path.find('\0') != std::string::npos) return Invalid("path contains a NUL byte");
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below as not regular.
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) return ErrnoStatus(errno, path, "open");
  FdCloser closer(fd);
  return ReadFrom(fd, path, limits);
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::ReadFrom(int fd, const std::string& path,
                                                          const SafetensorsLimits& limits) {
  struct stat st;
  if (fstat(fd, &st) != 0) return ErrnoStatus(errno, path, "stat");
  if (!S_ISREG(st.st_mode))
    return Invalid(absl::StrCat(QuoteForMessage(path), " is not a regular file"));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > limits.max_file_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(QuoteForMessage(path), ": file is ", size,
                                                     " bytes, over the limit of ",
                                                     limits.max_file_bytes));
  }
  std::string bytes;
  try {
    bytes.resize(size);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat(QuoteForMessage(path), ": cannot allocate ", size, " bytes"));
  }
  uint64_t done = 0;
  while (done < size) {
    const ssize_t n = read(fd, bytes.data() + done, size - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, path, "read");
    }
    if (n == 0) break;
    done += static_cast<uint64_t>(n);
  }
  char extra;
  ssize_t more;
  do {
    more = read(fd, &extra, 1);
  } while (more < 0 && errno == EINTR);
  if (done != size || more > 0) {
    return absl::AbortedError(
        absl::StrCat(QuoteForMessage(path), " changed size while being read"));
  }
  absl::StatusOr<SafetensorsFile> file = Parse(std::move(bytes), limits);
  if (!file.ok()) {
    return absl::Status(file.status().code(),
                        absl::StrCat(QuoteForMessage(path), ": ", file.status().message()));
  }
  return file;
}

const SafetensorsTensor* SafetensorsFile::Find(absl::string_view name) const {
  auto it =
      std::lower_bound(tensors_.begin(), tensors_.end(), name,
                       [](const SafetensorsTensor& t, absl::string_view n) { return t.name < n; });
  if (it == tensors_.end() || it->name != name) return nullptr;
  return &*it;
}

absl::Span<const uint8_t> SafetensorsFile::Data(const SafetensorsTensor& tensor) const {
  // Offsets were validated against the data section in Parse; a tensor from another file that
  // does not fit this one gets an empty span rather than an out-of-bounds one.
  const uint64_t data_bytes = bytes_.size() - std::min<uint64_t>(data_start_, bytes_.size());
  if (tensor.data_begin > tensor.data_end || tensor.data_end > data_bytes) return {};
  return absl::Span<const uint8_t>(
      reinterpret_cast<const uint8_t*>(bytes_.data()) + data_start_ + tensor.data_begin,
      tensor.data_end - tensor.data_begin);
}

std::string WriteSafetensors(const std::vector<SafetensorsTensorToWrite>& tensors,
                             const std::map<std::string, std::string>& metadata) {
  std::vector<const SafetensorsTensorToWrite*> order;
  order.reserve(tensors.size());
  for (const SafetensorsTensorToWrite& t : tensors) order.push_back(&t);
  std::stable_sort(order.begin(), order.end(),
                   [](const SafetensorsTensorToWrite* a, const SafetensorsTensorToWrite* b) {
                     const int ra = DTypeRank(a->dtype), rb = DTypeRank(b->dtype);
                     if (ra != rb) return ra > rb;
                     return a->name < b->name;
                   });

  // ordered_json keeps insertion order: "__metadata__" first, then tensors in data order, each
  // with dtype, shape, data_offsets, which is byte for byte what the reference writes.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    header[std::string(kMetadataKey)] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const SafetensorsTensorToWrite* t : order) {
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["dtype"] = t->dtype;
    entry["shape"] = t->shape;
    // Offsets follow the bytes given, so the file is self-consistent even when a caller's data
    // does not match its shape (the reader then names that tensor).
    entry["data_offsets"] = {offset, offset + t->data.size()};
    offset += t->data.size();
    header[t->name] = std::move(entry);
  }
  // Invalid UTF-8 in a name or value is replaced (U+FFFD) rather than thrown.
  std::string json = header.dump(-1, ' ', /*ensure_ascii=*/false,
                                 nlohmann::ordered_json::error_handler_t::replace);
  json.append((8 - json.size() % 8) % 8, ' ');

  std::string out;
  out.reserve(kLengthFieldBytes + json.size() + offset);
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) {
    out.push_back(static_cast<char>(n & 0xff));
    n >>= 8;
  }
  out += json;
  for (const SafetensorsTensorToWrite* t : order) out += t->data;
  return out;
}

}  // namespace probesidecar::common
