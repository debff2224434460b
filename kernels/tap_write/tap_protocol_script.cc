#include "kernels/tap_write/tap_protocol_script.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>

#include "kernels/tap_write/tap_write_ref.h"

namespace probesidecar::kernels::tap_protocol {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

bool DTypeOf(const std::string& name, common::DType* out) {
  for (common::DType d :
       {common::DType::kFloat32, common::DType::kFloat16, common::DType::kBFloat16}) {
    if (name == common::DTypeName(d)) {
      *out = d;
      return true;
    }
  }
  return false;
}

void Store(common::DType dtype, double value, uint8_t* at) {
  const auto f = static_cast<float>(value);
  if (dtype == common::DType::kFloat32) {
    std::memcpy(at, &f, 4);
    return;
  }
  const uint16_t bits =
      dtype == common::DType::kFloat16 ? common::FloatToHalf(f) : common::FloatToBf16(f);
  std::memcpy(at, &bits, 2);
}

float Load(common::DType dtype, const uint8_t* at) {
  if (dtype == common::DType::kFloat32) {
    float f;
    std::memcpy(&f, at, 4);
    return f;
  }
  uint16_t bits;
  std::memcpy(&bits, at, 2);
  return dtype == common::DType::kFloat16 ? common::HalfToFloat(bits) : common::Bf16ToFloat(bits);
}

bool Same(float a, float b) { return std::isnan(a) ? std::isnan(b) : a == b; }

std::string Num(int64_t v) { return v < 0 ? "null" : std::to_string(v); }

}  // namespace

int Script::Checkpoints() const {
  return static_cast<int>(std::count_if(ops.begin(), ops.end(),
                                        [](const Op& op) { return op.kind == Op::Kind::kRead; }));
}

bool ParseScript(const std::string& text, Script* out, std::string* error) {
  Script script;
  std::istringstream lines(text);
  std::string line;
  bool have_ring = false;
  int number = 0;
  int64_t slot_limit = 0;
  while (std::getline(lines, line)) {
    ++number;
    line = line.substr(0, line.find('#'));
    std::istringstream words(line);
    std::string word;
    if (!(words >> word)) continue;
    auto fail = [&](const std::string& why) {
      *error = "line " + std::to_string(number) + ": " + why + ": " + line;
      return false;
    };
    if (word == "ring") {
      std::string dtype;
      int device_scores = 0;
      if (have_ring ||
          !(words >> script.window >> script.max_batch >> script.hidden >> script.num_probes >>
            dtype >> device_scores) ||
          !DTypeOf(dtype, &script.dtype) || script.window < 1 || script.max_batch < 1 ||
          script.hidden < 1 || script.num_probes < 1) {
        return fail("expected one ring K MAX_BATCH H P fp32|fp16|bf16 0|1 first");
      }
      script.device_scores = device_scores != 0;
      have_ring = true;
      slot_limit = 2 * int64_t{script.window};
      continue;
    }
    if (!have_ring) return fail("the ring line comes first");
    Op op;
    if (word == "write") {
      std::string kind;
      op.kind = Op::Kind::kWrite;
      if (!(words >> op.n >> op.stride_extra >> kind >> op.count) || op.n < 1 ||
          op.n > script.max_batch || op.stride_extra < 0 ||
          (kind != "none" && kind != "i32" && kind != "i64")) {
        return fail("expected write N STRIDE_EXTRA none|i32|i64 COUNT, 1 <= N <= max_batch");
      }
      op.count_kind = kind == "none" ? 0 : kind == "i32" ? 1 : 2;
      if (op.count_kind == 1 && (op.count < std::numeric_limits<int32_t>::min() ||
                                 op.count > std::numeric_limits<int32_t>::max())) {
        return fail("an i32 count out of range");
      }
    } else if (word == "close") {
      int record = 1;
      op.kind = Op::Kind::kClose;
      if (!(words >> op.half >> op.next_base >> op.next_limit >> record) ||
          (op.half != 0 && op.half != 1) || op.next_base < 0 || op.next_limit < op.next_base ||
          op.next_limit > slot_limit) {
        return fail("expected close HALF NEXT_BASE NEXT_LIMIT 0|1, 0 <= base <= limit <= 2K");
      }
      op.record = record != 0;
    } else if (word == "read") {
      op.kind = Op::Kind::kRead;
      if (!(words >> op.half >> op.steps) || (op.half != 0 && op.half != 1) || op.steps < 1 ||
          op.steps > script.window) {
        return fail("expected read HALF STEPS, 1 <= STEPS <= K");
      }
    } else {
      return fail("unknown operation");
    }
    if (words >> word) return fail("trailing words");
    script.ops.push_back(op);
  }
  if (!have_ring) {
    *error = "no ring line";
    return false;
  }
  *out = std::move(script);
  return true;
}

std::string ScriptText(const Script& s) {
  std::ostringstream out;
  out << "ring " << s.window << ' ' << s.max_batch << ' ' << s.hidden << ' ' << s.num_probes << ' '
      << common::DTypeName(s.dtype) << ' ' << (s.device_scores ? 1 : 0) << '\n';
  static const char* const kKinds[] = {"none", "i32", "i64"};
  for (const Op& op : s.ops) {
    switch (op.kind) {
      case Op::Kind::kWrite:
        out << "write " << op.n << ' ' << op.stride_extra << ' ' << kKinds[op.count_kind] << ' '
            << op.count << '\n';
        break;
      case Op::Kind::kClose:
        out << "close " << op.half << ' ' << op.next_base << ' ' << op.next_limit << ' '
            << (op.record ? 1 : 0) << '\n';
        break;
      case Op::Kind::kRead:
        out << "read " << op.half << ' ' << op.steps << '\n';
        break;
    }
  }
  return out.str();
}

Script WrappedScenario(int32_t window, int32_t max_batch, int32_t hidden, int32_t num_probes,
                       common::DType dtype, bool device_scores) {
  Script s;
  s.window = window;
  s.max_batch = max_batch;
  s.hidden = hidden;
  s.num_probes = num_probes;
  s.dtype = dtype;
  s.device_scores = device_scores;
  const int32_t k = window;
  int64_t writes = 0;
  auto write = [&](int32_t n) {
    Op op;
    op.kind = Op::Kind::kWrite;
    op.n = n > 0 ? n : 1 + static_cast<int32_t>((writes * 3) % max_batch);
    op.stride_extra = static_cast<int32_t>((writes % 3) * 3);
    op.count_kind = static_cast<int>(writes % 4 == 3 ? 1 : writes % 4);
    if (op.count_kind == 1) op.count = (writes * 5) % (max_batch + 4) - 2;  // some < 0, some > n
    if (op.count_kind == 2) op.count = writes % 3 == 0 ? int64_t{1} << 40 : writes % (op.n + 1);
    s.ops.push_back(op);
    ++writes;
  };
  auto close = [&](int32_t half, bool divert, bool record) {
    Op op;
    op.kind = Op::Kind::kClose;
    op.half = half;
    op.next_base = int64_t{1 - half} * k;
    op.next_limit = divert ? op.next_base : op.next_base + k;
    op.record = record;
    s.ops.push_back(op);
  };
  auto read = [&](int32_t half, int32_t steps) {
    Op op;
    op.kind = Op::Kind::kRead;
    op.half = half;
    op.steps = steps;
    s.ops.push_back(op);
  };
  // (writes, steps read, whether the close diverts the next window, lost: the window diverted)
  struct Window {
    int32_t writes, steps;
    bool divert_next, lost;
    int32_t rows;  // 0: rows vary write by write
  };
  const Window windows[] = {
      {k, k, false, false, 0},           // a full window
      {k + 2, k, false, false, 0},       // two writes past its end: the spare slot
      {1, 1, false, false, 0},           // a partial window (flush)
      {k, k, true, false, 0},            // full; the next window's half is busy: diverted
      {2, 0, false, true, 0},            // the lost window: spare slot only, its count not kept
      {k - 1, k - 1, false, false, -1},  // max_batch rows each (none when K = 1)
      {k + 1, k, false, false, 0},       // one past the end
      {0, 1, false, false, 0},           // a step that wrote nothing: the slot's old rows
      {k, k, false, false, 0},
  };
  int32_t half = 0, last_steps[2] = {0, 0};
  for (const Window& w : windows) {
    if (w.steps < 1 && !w.lost) continue;  // a window of K - 1 steps when K = 1
    for (int32_t i = 0; i < w.writes; ++i) write(w.rows < 0 ? max_batch : 0);
    close(half, w.divert_next, !w.lost);
    if (w.lost) {
      // Nothing of the lost window is in its half: the half's last window reads as it was.
      read(half, last_steps[half]);
    } else {
      read(half, w.steps);
      last_steps[half] = w.steps;
    }
    half = 1 - half;
  }
  return s;
}

double SourceValue(int64_t write, int64_t row, int64_t col) {
  return static_cast<double>((write * 37 + row * 11 + col * 3) % 97 - 48) / 4.0;
}

double ScoreValue(int64_t checkpoint, int64_t row, int64_t probe) {
  return static_cast<double>((checkpoint * 13 + row * 7 + probe * 5) % 101 - 50) / 8.0;
}

std::vector<uint8_t> SourceRows(const Script& s, const Op& op, int64_t write) {
  const int64_t element = common::DTypeSize(s.dtype), stride = s.hidden + op.stride_extra;
  std::vector<uint8_t> bytes(op.n * stride * element);
  for (int64_t r = 0; r < op.n; ++r) {
    for (int64_t c = 0; c < stride; ++c) {
      Store(s.dtype, c < s.hidden ? SourceValue(write, r, c) : kNaN,
            bytes.data() + (r * stride + c) * element);
    }
  }
  return bytes;
}

std::vector<uint8_t> PoisonedRing(const TapRingLayout& layout) {
  std::vector<uint8_t> ring(layout.total_bytes, 0xff);
  const std::array<int64_t, kTapMetaSize> meta = TapInitialMeta(layout.window);
  std::memcpy(ring.data() + layout.meta, meta.data(), sizeof(meta));
  return ring;
}

std::vector<WindowRead> Model(const Script& s) {
  const int64_t k = s.window, spare = 2 * k;
  std::vector<std::vector<int64_t>> row_source(spare + 1, std::vector<int64_t>(s.max_batch, -1));
  std::vector<int32_t> counts(spare + 1, -1);
  int64_t next = 0, limit = k, writes = 0, half_writes[2] = {0, 0}, write = 0, checkpoint = 0;
  std::vector<WindowRead> out;
  for (const Op& op : s.ops) {
    if (op.kind == Op::Kind::kWrite) {
      const int64_t target = next < limit ? next : spare;
      for (int32_t r = 0; r < op.n; ++r) row_source[target][r] = write;
      const int64_t count = op.count_kind == 0 ? op.n : op.count;
      counts[target] = static_cast<int32_t>(std::clamp<int64_t>(count, 0, op.n));
      next = std::min(next + 1, limit);
      ++writes;
      ++write;
    } else if (op.kind == Op::Kind::kClose) {
      if (op.record) half_writes[op.half] = writes;
      next = op.next_base;
      limit = op.next_limit;
      writes = 0;
    } else {
      WindowRead w;
      const int64_t first = op.half * k;
      for (int64_t slot = first; slot < first + op.steps; ++slot) {
        for (int32_t r = 0; r < s.max_batch; ++r) {
          for (int32_t c = 0; c < s.hidden; ++c) {
            const int64_t source = row_source[slot][r];
            w.rows.push_back(source < 0 ? kNaN : static_cast<float>(SourceValue(source, r, c)));
          }
        }
        w.counts.push_back(counts[slot]);
      }
      w.writes = half_writes[op.half];
      if (s.device_scores) w.scores = CheckpointScores(s.Layout(), op.steps, checkpoint);
      out.push_back(std::move(w));
      ++checkpoint;
    }
  }
  return out;
}

WindowRead ReadWindow(const uint8_t* ring, const TapRingLayout& layout, int32_t half,
                      int32_t steps) {
  const TapWindowParts parts = MakeTapWindowParts(layout, half, steps);
  WindowRead w;
  const int64_t element = layout.element_size;
  w.rows.resize(parts.rows * layout.hidden);
  for (size_t i = 0; i < w.rows.size(); ++i) {
    w.rows[i] = Load(layout.dtype, ring + parts.activations + static_cast<int64_t>(i) * element);
  }
  w.counts.resize(steps);
  std::memcpy(w.counts.data(), ring + parts.counts, steps * sizeof(int32_t));
  std::memcpy(&w.writes, ring + parts.writes, sizeof(int64_t));
  if (parts.scores >= 0) {
    w.scores.resize(parts.rows * layout.num_probes);
    std::memcpy(w.scores.data(), ring + parts.scores, w.scores.size() * sizeof(float));
  }
  return w;
}

std::vector<float> CheckpointScores(const TapRingLayout& layout, int32_t steps,
                                    int64_t checkpoint) {
  std::vector<float> scores(int64_t{steps} * layout.max_batch * layout.num_probes);
  for (int64_t row = 0; row < int64_t{steps} * layout.max_batch; ++row) {
    for (int32_t p = 0; p < layout.num_probes; ++p) {
      scores[row * layout.num_probes + p] = static_cast<float>(ScoreValue(checkpoint, row, p));
    }
  }
  return scores;
}

std::string CompareWindow(const WindowRead& want, const WindowRead& got, int64_t checkpoint) {
  std::ostringstream out;
  int shown = 0;
  auto differ = [&](const std::string& what, size_t i, double w, double g) {
    if (shown++ < 8) {
      out << "checkpoint " << checkpoint << ": " << what << "[" << i << "] = " << g << ", want "
          << w << "\n";
    }
  };
  if (got.rows.size() != want.rows.size() || got.counts.size() != want.counts.size() ||
      got.scores.size() != want.scores.size()) {
    out << "checkpoint " << checkpoint << ": sizes differ (rows " << got.rows.size() << " vs "
        << want.rows.size() << ", counts " << got.counts.size() << " vs " << want.counts.size()
        << ", scores " << got.scores.size() << " vs " << want.scores.size() << ")\n";
    return out.str();
  }
  for (size_t i = 0; i < want.rows.size(); ++i) {
    if (!Same(want.rows[i], got.rows[i])) differ("rows", i, want.rows[i], got.rows[i]);
  }
  for (size_t i = 0; i < want.counts.size(); ++i) {
    if (want.counts[i] != got.counts[i]) differ("counts", i, want.counts[i], got.counts[i]);
  }
  if (want.writes != got.writes) {
    differ("writes", 0, static_cast<double>(want.writes), static_cast<double>(got.writes));
  }
  for (size_t i = 0; i < want.scores.size(); ++i) {
    if (!Same(want.scores[i], got.scores[i])) differ("scores", i, want.scores[i], got.scores[i]);
  }
  if (shown > 8) out << "checkpoint " << checkpoint << ": " << shown << " differences in all\n";
  return out.str();
}

std::string CompareRings(const std::vector<uint8_t>& want, const std::vector<uint8_t>& got,
                         const TapRingLayout& layout, const std::string& what) {
  if (want.size() != got.size()) {
    return what + ": " + std::to_string(got.size()) + " bytes, want " +
           std::to_string(want.size()) + "\n";
  }
  if (want == got) return "";
  size_t i = 0;
  while (want[i] == got[i]) ++i;
  const auto at = static_cast<int64_t>(i);
  std::string part = at >= layout.meta                           ? "meta"
                     : at >= layout.gather                       ? "gather"
                     : at >= layout.counts                       ? "counts"
                     : layout.rows >= 0 && at >= layout.rows     ? "rows"
                     : layout.scores >= 0 && at >= layout.scores ? "scores"
                                                                 : "slots";
  if (part == "slots") {
    part += " slot " + std::to_string(at / layout.slot_bytes) + " byte " +
            std::to_string(at % layout.slot_bytes);
  } else if (part == "meta") {
    part += " [" + std::to_string((at - layout.meta) / 8) + "]";
  }
  size_t differing = 0;
  for (size_t j = 0; j < want.size(); ++j) differing += want[j] != got[j];
  return what + ": first difference at byte " + std::to_string(i) + " (" + part +
         "): " + std::to_string(got[i]) + ", want " + std::to_string(want[i]) + "; " +
         std::to_string(differing) + " bytes differ\n";
}

TapWriteParams WriteParams(const Script& s, const Op& op, uint8_t* ring, const void* src,
                           const int32_t* count32, const int64_t* count64) {
  TapWriteParams p = TapRingWriteParams(s.Layout(), ring);
  p.src = src;
  p.num_rows32 = count32;
  p.num_rows64 = count64;
  p.src_row_stride = s.hidden + op.stride_extra;
  p.n = op.n;
  return p;
}

std::vector<std::vector<uint8_t>> RunReference(const Script& s) {
  const TapRingLayout layout = s.Layout();
  std::vector<uint8_t> ring = PoisonedRing(layout);
  std::vector<std::vector<uint8_t>> saved;
  int64_t write = 0, checkpoint = 0;
  auto* meta = reinterpret_cast<int64_t*>(ring.data() + layout.meta);
  for (const Op& op : s.ops) {
    if (op.kind == Op::Kind::kWrite) {
      const std::vector<uint8_t> src = SourceRows(s, op, write++);
      const auto count32 = static_cast<int32_t>(op.count);
      TapWriteRef(WriteParams(s, op, ring.data(), src.data(),
                              op.count_kind == 1 ? &count32 : nullptr,
                              op.count_kind == 2 ? &op.count : nullptr));
    } else if (op.kind == Op::Kind::kClose) {
      TapCloseParams c{meta, op.half, op.next_base, op.next_limit};
      c.record_writes = op.record;
      TapCloseRef(c);
    } else {
      const TapWindowParts parts = MakeTapWindowParts(layout, op.half, op.steps);
      if (parts.scores >= 0) {
        const std::vector<float> scores = CheckpointScores(layout, op.steps, checkpoint);
        std::memcpy(ring.data() + parts.scores, scores.data(), scores.size() * sizeof(float));
      }
      saved.push_back(ring);
      ++checkpoint;
    }
  }
  saved.push_back(ring);
  return saved;
}

bool WriteFile(const std::string& path, const std::vector<uint8_t>& bytes, std::string* error) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file.write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  file.close();
  if (!file) {
    *error = "cannot write " + path;
    return false;
  }
  return true;
}

bool ReadFile(const std::string& path, std::vector<uint8_t>* bytes, std::string* error) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    *error = "cannot read " + path;
    return false;
  }
  bytes->assign(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
  return true;
}

std::vector<uint8_t> ExpectedBytes(const std::vector<WindowRead>& windows) {
  std::vector<uint8_t> out;
  auto append = [&out](const void* data, size_t size) {
    const auto* b = static_cast<const uint8_t*>(data);
    out.insert(out.end(), b, b + size);
  };
  for (const WindowRead& w : windows) {
    append(w.rows.data(), w.rows.size() * sizeof(float));
    append(w.counts.data(), w.counts.size() * sizeof(int32_t));
    append(&w.writes, sizeof(int64_t));
    append(w.scores.data(), w.scores.size() * sizeof(float));
  }
  return out;
}

bool ParseExpected(const Script& s, const std::vector<uint8_t>& bytes, std::vector<WindowRead>* out,
                   std::string* error) {
  size_t at = 0;
  auto take = [&](void* data, size_t size) {
    if (at + size > bytes.size()) return false;
    if (size == 0) return true;  // an empty part's data() may be null: memcpy must not see it
    std::memcpy(data, bytes.data() + at, size);
    at += size;
    return true;
  };
  out->clear();
  for (const Op& op : s.ops) {
    if (op.kind != Op::Kind::kRead) continue;
    WindowRead w;
    const int64_t rows = int64_t{op.steps} * s.max_batch;
    w.rows.resize(rows * s.hidden);
    w.counts.resize(op.steps);
    if (s.device_scores) w.scores.resize(rows * s.num_probes);
    if (!take(w.rows.data(), w.rows.size() * 4) || !take(w.counts.data(), w.counts.size() * 4) ||
        !take(&w.writes, 8) || !take(w.scores.data(), w.scores.size() * 4)) {
      *error = "expected.bin is shorter than the script's checkpoints";
      return false;
    }
    out->push_back(std::move(w));
  }
  if (at != bytes.size()) {
    *error = "expected.bin is longer than the script's checkpoints";
    return false;
  }
  return true;
}

std::vector<uint8_t> JoinRings(const std::vector<std::vector<uint8_t>>& rings) {
  std::vector<uint8_t> out;
  for (const auto& ring : rings) out.insert(out.end(), ring.begin(), ring.end());
  return out;
}

bool LayoutJson(const std::vector<std::string>& configs, std::string* json, std::string* error) {
  std::ostringstream out;
  out << "{\n  \"constants\": {\"kTapMetaNextSlot\": " << kTapMetaNextSlot
      << ", \"kTapMetaLimit\": " << kTapMetaLimit << ", \"kTapMetaTicket\": " << kTapMetaTicket
      << ", \"kTapMetaWrites\": " << kTapMetaWrites
      << ", \"kTapMetaHalfWrites\": " << kTapMetaHalfWrites
      << ", \"kTapMetaArmed\": " << kTapMetaArmed << ", \"kTapMetaRest\": " << kTapMetaRest
      << ", \"kTapMetaSize\": " << kTapMetaSize << ", \"kTapArmedOff\": " << kTapArmedOff
      << ", \"kTapArmedFollow\": " << kTapArmedFollow << ", \"kTapRingAlign\": " << kTapRingAlign
      << "},\n  \"configs\": [";
  for (size_t i = 0; i < configs.size(); ++i) {
    std::string text = configs[i];
    std::replace(text.begin(), text.end(), ',', ' ');
    std::istringstream words(text);
    int32_t window = 0, max_batch = 0, hidden = 0, probes = 0;
    int device_scores = 0;
    std::string dtype_name;
    common::DType dtype;
    if (!(words >> window >> max_batch >> hidden >> probes >> dtype_name >> device_scores) ||
        !DTypeOf(dtype_name, &dtype) || window < 1 || max_batch < 1 || hidden < 1 || probes < 1) {
      *error = "a configuration is K,MAX_BATCH,H,P,fp32|fp16|bf16,0|1: " + configs[i];
      return false;
    }
    const TapRingLayout l =
        MakeTapRingLayout(window, max_batch, hidden, probes, dtype, device_scores != 0);
    const std::array<int64_t, kTapMetaSize> meta = TapInitialMeta(window);
    out << (i ? "," : "") << "\n    {\"config\": [" << window << ", " << max_batch << ", " << hidden
        << ", " << probes << ", \"" << dtype_name << "\", "
        << (device_scores != 0 ? "true" : "false") << "],\n     \"layout\": {\"slots\": " << l.slots
        << ", \"scores\": " << Num(l.scores) << ", \"rows\": " << Num(l.rows)
        << ", \"counts\": " << l.counts << ", \"gather\": " << l.gather << ", \"meta\": " << l.meta
        << ", \"total_bytes\": " << l.total_bytes << ", \"slot_bytes\": " << l.slot_bytes
        << ", \"element_size\": " << l.element_size << ", \"overflow_slot\": " << 2 * window
        << "},\n     \"initial_meta\": [";
    for (int m = 0; m < kTapMetaSize; ++m) out << (m ? ", " : "") << meta[m];
    out << "],\n     \"windows\": [";
    bool first = true;
    for (int32_t half = 0; half < 2; ++half) {
      for (int32_t steps = 1; steps <= window; ++steps) {
        const TapWindowParts w = MakeTapWindowParts(l, half, steps);
        out << (first ? "" : ",") << "\n       {\"half\": " << half << ", \"steps\": " << steps
            << ", \"first_slot\": " << w.first_slot << ", \"rows\": " << w.rows
            << ", \"activations\": " << w.activations << ", \"device_rows\": " << Num(w.device_rows)
            << ", \"counts\": " << w.counts << ", \"scores\": " << Num(w.scores)
            << ", \"writes\": " << w.writes << "}";
        first = false;
      }
    }
    out << "]}";
  }
  out << "\n  ]\n}\n";
  *json = out.str();
  return true;
}

namespace {

// One script's run-ref or read (RunTapProtocolCommand).
int RunScriptCommand(const std::string& command, const std::string& script_path,
                     const std::string& dir) {
  auto fail = [](const std::string& why) {
    std::fprintf(stderr, "%s\n", why.c_str());
    return 2;
  };
  std::string error;
  std::vector<uint8_t> text;
  Script script;
  if (!ReadFile(script_path, &text, &error) ||
      !ParseScript(std::string(text.begin(), text.end()), &script, &error)) {
    return fail(error);
  }
  const TapRingLayout layout = script.Layout();
  if (command == "run-ref") {
    if (!WriteFile(dir + "/rings.bin", JoinRings(RunReference(script)), &error) ||
        !WriteFile(dir + "/expected.bin", ExpectedBytes(Model(script)), &error)) {
      return fail(error);
    }
    return 0;
  }
  // read: the rings another writer saved.
  std::vector<uint8_t> rings, expected_bytes;
  std::vector<WindowRead> expected;
  if (!ReadFile(dir + "/rings.bin", &rings, &error) ||
      !ReadFile(dir + "/expected.bin", &expected_bytes, &error) ||
      !ParseExpected(script, expected_bytes, &expected, &error)) {
    return fail(error);
  }
  const size_t checkpoints = static_cast<size_t>(script.Checkpoints());
  if (rings.size() != (checkpoints + 1) * static_cast<size_t>(layout.total_bytes)) {
    return fail("rings.bin holds " + std::to_string(rings.size()) + " bytes, want " +
                std::to_string(checkpoints + 1) + " rings of " +
                std::to_string(layout.total_bytes));
  }
  const std::vector<WindowRead> model = Model(script);
  const std::vector<std::vector<uint8_t>> reference = RunReference(script);
  std::string report;
  size_t checkpoint = 0;
  for (const Op& op : script.ops) {
    if (op.kind != Op::Kind::kRead) continue;
    const uint8_t* ring = rings.data() + checkpoint * layout.total_bytes;
    const WindowRead got = ReadWindow(ring, layout, op.half, op.steps);
    report += CompareWindow(expected[checkpoint], got, static_cast<int64_t>(checkpoint));
    report += CompareWindow(model[checkpoint], got, static_cast<int64_t>(checkpoint));
    ++checkpoint;
  }
  for (size_t i = 0; i <= checkpoints; ++i) {
    const std::vector<uint8_t> ring(rings.begin() + i * layout.total_bytes,
                                    rings.begin() + (i + 1) * layout.total_bytes);
    report += CompareRings(reference[i], ring, layout,
                           i < checkpoints ? "ring at checkpoint " + std::to_string(i)
                                           : std::string("ring at the end"));
  }
  if (!report.empty()) {
    std::fprintf(stderr, "tap protocol: the C++ reader disagrees with the rings in %s:\n%s",
                 dir.c_str(), report.c_str());
    return 1;
  }
  std::printf("tap protocol: %zu windows read, %zu rings equal to the reference\n", checkpoints,
              checkpoints + 1);
  return 0;
}

}  // namespace

int RunTapProtocolCommand(int argc, char** argv) {
  if (argc < 2) return -1;
  const std::string command = argv[1];
  auto fail = [](const std::string& why) {
    std::fprintf(stderr, "%s\n", why.c_str());
    return 2;
  };
  std::string error;
  if (command == "layout") {
    std::string json;
    if (!LayoutJson(std::vector<std::string>(argv + 2, argv + argc), &json, &error)) {
      return fail(error);
    }
    std::fputs(json.c_str(), stdout);
    return 0;
  }
  if (command == "scenario") {
    // The arguments are a script's ring line, checked as one.
    std::string ring_line = "ring";
    for (int i = 2; i < argc; ++i) ring_line += std::string(" ") + argv[i];
    Script ring;
    if (argc != 8 || !ParseScript(ring_line, &ring, &error)) {
      return fail("usage: scenario K MAX_BATCH H P fp32|fp16|bf16 0|1 (K, MAX_BATCH, H, P >= 1)" +
                  (error.empty() ? std::string() : ": " + error));
    }
    const Script s = WrappedScenario(ring.window, ring.max_batch, ring.hidden, ring.num_probes,
                                     ring.dtype, ring.device_scores);
    std::fputs(ScriptText(s).c_str(), stdout);
    return 0;
  }
  if (command != "run-ref" && command != "read") return -1;
  if (argc < 4 || argc % 2 != 0) return fail("usage: " + command + " SCRIPT DIR [SCRIPT DIR...]");
  int status = 0;
  for (int i = 2; i < argc && status != 2; i += 2) {
    status = std::max(status, RunScriptCommand(command, argv[i], argv[i + 1]));
  }
  return status;
}

}  // namespace probesidecar::kernels::tap_protocol
