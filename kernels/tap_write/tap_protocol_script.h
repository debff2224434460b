// The tap protocol's cross-language checks (docs/tap-protocol.md), test code only: a script of ring
// operations in a small text format that the C++ and the Python sides both run (writes, closes,
// and read checkpoints at which a sidecar writes the window's scores and a reader reads it), the
// rows they write (exact in every dtype), the model of what each checkpoint must read (from the
// slot rules alone, not from any ring's bytes), the C++ reader (MakeTapWindowParts over a ring's
// bytes), and the files the two sides exchange. Plain C++; tap_protocol_tool and
// tap_protocol_gpu_test are its commands (RunTapProtocolCommand).
//
// Script, one operation a line ('#' starts a comment):
//   ring K MAX_BATCH H P DTYPE DEVICE_SCORES   first: the ring (DTYPE fp32, fp16 or bf16; 0/1)
//   write N STRIDE_EXTRA COUNT_KIND COUNT      N rows of H (+ STRIDE_EXTRA NaN elements between
//                                              rows, never copied); the row count none (N), i32
//                                              or i64 COUNT read on the device (clamped to [0, N])
//   close HALF NEXT_BASE NEXT_LIMIT RECORD     TapCloseParams (RECORD: record_writes, 0/1)
//   read HALF STEPS                            a checkpoint: the sidecar writes that window's
//                                              scores (ScoreValue, at the writer's own offsets),
//                                              the ring is saved, and a reader must then read it
// The write numbered w (0, 1, ... in the script) copies SourceValue(w, row, col).
//
// Files of a run (in one directory): rings.bin, the ring's bytes at every checkpoint and at the end
// (checkpoints + 1 rings of total_bytes); expected.bin, per checkpoint the window as the model has
// it: rows float32 [steps * max_batch, H] (NaN: never written), counts int32 [steps] (-1: never
// written), the write count int64, then with device scores the scores float32
// [steps * max_batch, P].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "kernels/tap_write/tap_write.h"

namespace probesidecar::kernels::tap_protocol {

struct Op {
  enum class Kind { kWrite, kClose, kRead };
  Kind kind = Kind::kWrite;
  // write
  int32_t n = 0;
  int32_t stride_extra = 0;
  int count_kind = 0;  // 0: none, 1: int32, 2: int64
  int64_t count = 0;
  // close and read
  int32_t half = 0;
  int64_t next_base = 0, next_limit = 0;
  bool record = true;
  int32_t steps = 0;
};

struct Script {
  int32_t window = 0, max_batch = 0, hidden = 0, num_probes = 0;
  common::DType dtype = common::DType::kFloat32;
  bool device_scores = true;
  std::vector<Op> ops;

  TapRingLayout Layout() const {
    return MakeTapRingLayout(window, max_batch, hidden, num_probes, dtype, device_scores);
  }
  int Checkpoints() const;
};

// False, with the reason in `error`, for text that is not a valid script.
bool ParseScript(const std::string& text, Script* out, std::string* error);
std::string ScriptText(const Script& script);

// A wrapped ring's windows for the given shape: full windows, writes past a window's end (the
// spare slot), a partial window, a diverted window and its close (record_writes false), a window
// whose step wrote nothing, strided sources and device row counts in and out of range; a read
// checkpoint after every scored window, halves alternating.
Script WrappedScenario(int32_t window, int32_t max_batch, int32_t hidden, int32_t num_probes,
                       common::DType dtype, bool device_scores);

// Write `write`'s element (row, col): multiples of 1/4 in [-12, 12], exact in fp32, fp16 and bf16.
double SourceValue(int64_t write, int64_t row, int64_t col);
// The sidecar's score of checkpoint `checkpoint`, window row `row`, probe `probe` (float32-exact).
double ScoreValue(int64_t checkpoint, int64_t row, int64_t probe);

// Write `write`'s source rows in the script's dtype: [n, hidden + stride_extra], padding NaN.
std::vector<uint8_t> SourceRows(const Script& script, const Op& op, int64_t write);
// The parameters of write `op` of `script` into the ring at `ring` (host or device memory, laid
// out as script.Layout()), its rows at `src`, its row count (where the op names one) at `count32`
// or `count64` (the other null).
TapWriteParams WriteParams(const Script& script, const Op& op, uint8_t* ring, const void* src,
                           const int32_t* count32, const int64_t* count64);

// A ring as both sides start it in these tests: 0xff bytes everywhere (NaN in every dtype, -1 in
// int32 counts), then meta = TapInitialMeta(K).
std::vector<uint8_t> PoisonedRing(const TapRingLayout& layout);

// One window as read: rows as float (NaN stays NaN), counts, write count, scores.
struct WindowRead {
  std::vector<float> rows;  // [steps * max_batch * H]
  std::vector<int32_t> counts;
  int64_t writes = 0;
  std::vector<float> scores;  // [steps * max_batch * P], empty without device scores
};

// What every checkpoint of `script` must read, from the slot rules alone.
std::vector<WindowRead> Model(const Script& script);

// The C++ reader: window (half, steps) of a ring's bytes, at MakeTapWindowParts' offsets.
WindowRead ReadWindow(const uint8_t* ring, const TapRingLayout& layout, int32_t half,
                      int32_t steps);

// The sidecar's part at a checkpoint: ScoreValue into the window's output, [rows, P] float32
// (host bytes; on the GPU, the same bytes copied to the device at `parts.scores`).
std::vector<float> CheckpointScores(const TapRingLayout& layout, int32_t steps, int64_t checkpoint);

// Every element of `got` against `want`: "" when equal, else the first differences.
std::string CompareWindow(const WindowRead& want, const WindowRead& got, int64_t checkpoint);
// Two rings' bytes: "" when equal, else where the first difference lies (part, slot).
std::string CompareRings(const std::vector<uint8_t>& want, const std::vector<uint8_t>& got,
                         const TapRingLayout& layout, const std::string& what);

// The script on a host ring with the CPU reference (TapWriteRef, TapCloseRef): the rings at every
// checkpoint and at the end, as a writer saves them.
std::vector<std::vector<uint8_t>> RunReference(const Script& script);

bool WriteFile(const std::string& path, const std::vector<uint8_t>& bytes, std::string* error);
bool ReadFile(const std::string& path, std::vector<uint8_t>* bytes, std::string* error);
std::vector<uint8_t> ExpectedBytes(const std::vector<WindowRead>& windows);
bool ParseExpected(const Script& script, const std::vector<uint8_t>& bytes,
                   std::vector<WindowRead>* out, std::string* error);
std::vector<uint8_t> JoinRings(const std::vector<std::vector<uint8_t>>& rings);

// The protocol as JSON (constants, TapInitialMeta, MakeTapRingLayout and MakeTapWindowParts) for
// configurations "K,MAX_BATCH,H,P,DTYPE,DEVICE_SCORES".
bool LayoutJson(const std::vector<std::string>& configs, std::string* json, std::string* error);

// The commands both binaries take (argv[1]); returns the exit status, or -1 when argv[1] is none
// of them:
//   layout CONFIG...          LayoutJson on stdout
//   scenario K MB H P DTYPE DEVICE_SCORES   WrappedScenario's script on stdout
//   run-ref SCRIPT DIR...     the script with the CPU reference: DIR/rings.bin, DIR/expected.bin
//   read SCRIPT DIR...        the C++ reader on the rings another writer saved in DIR: every
//                             checkpoint's window against DIR/expected.bin and against Model, and
//                             every ring byte for byte against RunReference; exit 1 on a mismatch
// (SCRIPT DIR...: one or more pairs)
int RunTapProtocolCommand(int argc, char** argv);

}  // namespace probesidecar::kernels::tap_protocol
