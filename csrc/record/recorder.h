// The hot path: fixed-size records appended to a per-thread chunk without
// locks. A chunk is filled by its thread only; the writer thread reads the
// committed prefix (release/acquire on `committed`) and takes the chunk over
// once the thread hands it in full. Chunks come from a bounded pool: when the
// writer falls behind, new events are dropped and counted, never blocked on.
#pragma once
#include <atomic>
#include <cstdint>
#include <string>

#include "common/clock.h"
#include "common/format.h"

namespace stepscope {

struct Record {
  uint64_t t0;    // ticks; equals t1 for instants and counters
  uint64_t t1;    // ticks
  uint64_t arg;   // free argument, or the counter value's bits
  uint32_t name;  // interned name id
  int32_t step;   // the process's current step when recorded
  uint8_t kind;
  uint8_t cat;
  uint8_t flags;  // kHasArg | kIntValue
};

constexpr uint32_t kChunkRecords = 4096;

struct Chunk {
  std::atomic<uint32_t> committed{0};  // written by the owning thread only
  uint32_t flushed = 0;                // read and written by the writer only
  uint64_t track = 0;
  Chunk* next = nullptr;  // free list / full queue link
  Record recs[kChunkRecords];
};

struct ThreadState {
  Chunk* cur = nullptr;
  uint64_t tid = 0;
  uint32_t generation = 0;
  bool described = false;  // track chunk written
  std::string name;
  ThreadState* next = nullptr;
};

// Process-wide state read on the hot path.
extern std::atomic<bool> g_enabled;
extern std::atomic<int32_t> g_step;
extern uint32_t g_generation;  // bumped in a forked child: thread states are stale
extern std::atomic<uint64_t> g_dropped;

ThreadState* register_thread();
Chunk* rotate_chunk(ThreadState* ts);  // hands in a full chunk, takes a free one

extern thread_local ThreadState* tls_state __attribute__((tls_model("initial-exec")));

inline void push(uint8_t kind, uint8_t cat, uint32_t name, uint64_t t0, uint64_t t1,
                 uint64_t arg, uint8_t flags) {
  ThreadState* ts = tls_state;
  if (__builtin_expect(ts == nullptr || ts->generation != g_generation, 0)) {
    ts = register_thread();
    if (!ts) return;
  }
  Chunk* c = ts->cur;
  uint32_t n = c ? c->committed.load(std::memory_order_relaxed) : kChunkRecords;
  if (__builtin_expect(n == kChunkRecords, 0)) {
    c = rotate_chunk(ts);
    if (!c) {
      g_dropped.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    n = 0;
  }
  Record& r = c->recs[n];
  r.t0 = t0;
  r.t1 = t1;
  r.arg = arg;
  r.name = name;
  r.step = g_step.load(std::memory_order_relaxed);
  r.kind = kind;
  r.cat = cat;
  r.flags = flags;
  c->committed.store(n + 1, std::memory_order_release);
}

inline void record_span(uint8_t cat, uint32_t name, uint64_t t0, uint64_t t1, uint64_t arg = 0,
                        bool has_arg = false) {
  if (!g_enabled.load(std::memory_order_relaxed)) return;
  push(kSpan, cat, name, t0, t1, arg, has_arg ? kHasArg : 0);
}

inline void record_instant_at(uint8_t cat, uint32_t name, uint64_t t, uint64_t arg, bool has_arg) {
  if (!g_enabled.load(std::memory_order_relaxed)) return;
  push(kInstant, cat, name, t, t, arg, has_arg ? kHasArg : 0);
}

inline void record_instant(uint8_t cat, uint32_t name, uint64_t arg = 0, bool has_arg = false) {
  record_instant_at(cat, name, ticks(), arg, has_arg);
}

// at: the sample's tick (0: now), so the counters of one sample share a timestamp.
void record_counter(uint8_t cat, uint32_t name, double value, uint64_t arg, bool has_arg, uint64_t at = 0);

// Interned names: register once, record the integer. Bounded (writer.cc): past
// the bound a name is recorded as kOverflowName (`folded`, when given, says so).
constexpr size_t kMaxNames = 65536;
constexpr size_t kMaxNameBytes = size_t(16) << 20;
constexpr const char* kOverflowName = "(other names)";
uint32_t intern(const std::string& s, bool* folded = nullptr);
bool is_interned(uint64_t id);  // an id intern() returned

// Steps: marks a new step of `mode` (an interned mode name) at tick `at` (0: now)
// and returns its number. Integrations that learn of a step late pass its start.
int32_t begin_step(uint32_t mode_name, uint64_t at = 0);
// Called at every step start (mode, number) when set: CUPTI's STEPSCOPE_STEPS window.
using StepHook = void (*)(uint32_t mode_name, int32_t step);
extern std::atomic<StepHook> g_step_hook;
void end_step(uint64_t at = 0);  // ends the calling thread's open step, if any
// Flags the calling thread's open step as interrupted (an iteration that ended without
// its optimizer step: SPEC §3), with a mark named "interrupted" at `at` (0: now) whose
// argument is the step's number; it begins and ends nothing. False: no step is open.
bool interrupt_step(uint64_t at = 0);
// Voids the calling thread's open step (the call it began met the end of the data): a
// mark named "void" at `at` (0: now) carries its number, readers take the step's begin
// as an end, and the next step of its mode gets that number. False: no step is open.
bool void_step(uint64_t at = 0);
// Ends the step of another thread's loop (`tid`: its OS thread id), at session end;
// the mark carries the thread in its argument.
void end_step_of_thread(uint64_t tid, uint64_t at);

// Session control (the writer). Returns an empty string on success, else the reason.
struct WriterOptions {
  std::string path;         // the trace file to create
  std::string header_json;  // process metadata stored in the file header
  int flush_interval_ms = 1000;
  size_t buffer_bytes = 32u << 20;
  uint64_t disk_floor_bytes = 0;   // free space left to the job: the larger of this
  double disk_floor_fraction = 0;  // and this fraction of the file system
};
std::string open_writer(const WriterOptions& opt);
void close_writer();
struct WriterStats {
  uint64_t written;
  uint64_t dropped;
  uint64_t bytes;
  uint64_t chunks_in_use;
  uint64_t names_folded;  // name lookups recorded as kOverflowName
  std::string error;
};
WriterStats writer_stats();
const TickConverter& converter();
void init_clock();
// STEPSCOPE_CLOCK=monotonic (true) or auto: chooses the tick source again unless a trace
// is open. The settings call it right after the module's import, before any tick is kept.
void choose_clock(bool monotonic);

}  // namespace stepscope
