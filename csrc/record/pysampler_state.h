// The Python stack sampler's shared state (pysampler*.cc): its bounds, the
// interning tables, the queue the writer drains, and what each part calls of another.
#pragma once
#include <Python.h>
#if PY_VERSION_HEX < 0x030B0000
#include <frameobject.h>  // PyFrame_GetBack: Python.h declares it only from 3.11
#endif

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "record/pyframes.h"

namespace stepscope {
namespace pysampler {

#if PY_VERSION_HEX >= 0x030D0000
#define SS_FINALIZING() Py_IsFinalizing()
#else
#define SS_FINALIZING() _Py_IsFinalizing()
#endif

constexpr int kMaxDepth = 512;                 // deeper stacks keep their innermost frames
constexpr size_t kMaxPending = size_t(1) << 20;  // samples queued while the writer stalls
constexpr size_t kMaxCodes = size_t(1) << 14;    // code objects kept alive: ~1 KiB each
constexpr size_t kMaxFrames = size_t(1) << 16;   // (code, line) frames, the last one kOtherCode
constexpr size_t kMaxStacks = size_t(1) << 18;
constexpr size_t kMaxOffsets = size_t(1) << 18;  // (code, instruction) -> frame: a cache only
constexpr const char* kOtherCode = "(other code: the sampler's tables are full)";
// A pass's owner: armed, the main thread walks it (pending call) unless the
// sampler claims it after the grace period; done, the main thread walked it.
enum PassState { kIdle, kArmed, kInMain, kDone, kSampler };
constexpr unsigned kRetry = 16;  // passes between offers to a main thread that did not come by

struct Frame {
  uint32_t func, file;
  int32_t line;
};
struct Sample {
  uint64_t tick;
  uint64_t tid;
  uint32_t stack;
};

struct CodeNames {
  uint32_t func, file;
};

// The frame reader's view of one code address: the code object last seen there,
// checked again (its identity copied) once in each pass that meets it.
struct CodeAt {
  pyframes::Code code;
  uint32_t ci = UINT32_MAX;  // its code index; UINT32_MAX: the tables were full (kOtherCode)
  uint64_t checked = 0;      // the pass that last checked it
};
// Whose a thread is: the job's, stepscope's own ("stepscope-..." threads), or not
// known yet (its samples wait until the sampler takes the GIL to look its name up).
enum ThreadKind { kJobThread, kOwnThread, kUnknownThread };
struct ThreadSeen {
  unsigned long ident;
  int kind;
  int lookups = 0;      // look-ups that did not find it in threading's registry
  int64_t cpu_ns = -1;  // its CPU clock when its frames were last read
  int64_t stack = -1;   // what they were (-1: none to reuse)
};
constexpr size_t kMaxThreadsSeen = size_t(1) << 16;  // past it, every thread is looked up again
constexpr size_t kMaxCodeAddresses = kMaxCodes * 4;  // addresses remembered (dead code's included)
constexpr size_t kMaxLineTableBytes = size_t(16) << 20;  // copied line tables, all together
constexpr int64_t kLookupEveryNs = 10000000;  // GIL takes for new threads: at most 100 a second
// A longer copy of a thread's frames reads torn (read_stack). A stack 512 deep takes
// ~0.8 ms to copy on the development VM: a bound below that would drop deep stacks.
constexpr int64_t kMaxReadNs = 2000000;
constexpr int kRereads = 2;  // copies again of a thread whose frames changed under the copy
constexpr int kLookups = 5;  // look-ups of a thread threading does not know: then the job's
constexpr std::chrono::nanoseconds kLate(1000000);
// An idle job: after kQuietPasses passes in which no thread ran, the frame reader
// wakes once per kQuietSpan (its instants' samples are the threads' unchanged
// stacks): a wake-up costs ~30 us of CPU on a VM, 0.3% of a core at 100 Hz.
constexpr int kQuietPasses = 20;  // ~200 ms: a sleep in a step never makes it quiet
constexpr std::chrono::milliseconds kQuietSpan(100);

struct State {
  // Control, guarded by mu.
  std::mutex mu;
  std::condition_variable cv;
  pthread_t thread{};
  bool running = false;
  bool stop = false;
  int hz = 100;
  pid_t owner = 0;

  // Tables and queue, guarded by data_mu; appended by the sampler thread only.
  std::mutex data_mu;
  std::vector<std::string> strings;
  std::vector<Frame> frames;
  std::vector<std::pair<int32_t, uint32_t>> stacks;  // (parent or -1, frame)
  std::vector<Sample> samples;
  size_t strings_written = 0, frames_written = 0, stacks_written = 0;
  uint64_t taken = 0, dropped = 0, passes = 0, bytes = 0;
  int64_t gil_wait_ns = 0, hold_ns = 0;
  std::atomic<int64_t> read_ns{0};  // the frame reader's passes (no GIL)
  uint64_t main_passes = 0;  // passes the main thread walked (a pending call), not the sampler
  uint64_t gil_passes = 0;   // passes that took the GIL (the frame reader: only to name new threads)
  uint64_t torn = 0;         // the frame reader's stacks dropped because they changed while read
  uint64_t late = 0;         // passes that began kLate or a tenth of the interval after their time
  uint64_t missed = 0;       // samples a quiet sampler could not give a thread that ran meanwhile
  bool read_frames = false;  // the method: frames read without the GIL (else the GIL walk)
  bool realtime = false;     // the sampler thread wakes at real-time priority (wake_on_time)

  // One pass's owner (see sampler_main): who walks it, the main thread or the sampler.
  std::atomic<int> pass{0};
  std::atomic<bool> queued{false};  // a pending call is in CPython's queue
  std::mutex pass_mu;
  std::condition_variable pass_cv;
  int64_t main_t1 = 0, main_t2 = 0;  // the main thread's walk, written before pass becomes kDone
  unsigned long sampler_ident = 0;   // the sampler thread's own ident: never sampled

  // Sampler thread only.
  std::unordered_map<std::string, uint32_t> string_ids;
  std::vector<CodeNames> code_names;                 // by code index
  std::unordered_map<uint64_t, uint32_t> frame_ids;  // code index << 32 | line
  std::unordered_map<uint64_t, uint32_t> offset_ids;  // code index << 32 | instruction offset
  std::unordered_map<PyObject*, uint32_t> code_index;  // the GIL walk's: holds a reference to each key
  std::unordered_map<uint64_t, uint32_t> stack_ids;  // (parent + 1) << 32 | frame
  uint32_t other_code = UINT32_MAX;                   // kOtherCode's frame, once made
  PyObject* threading_name = nullptr;  // "threading", made once
  PyObject* native_id_name = nullptr;  // "_native_id", made once
  PyObject* active_name = nullptr;     // "_active", made once
  PyObject* name_name = nullptr;       // "_name", made once
  PyObject* own_prefix = nullptr;      // "stepscope-": the names of stepscope's own threads
  // One pass's additions, moved to the shared tables after the GIL is released.
  std::vector<std::string> new_strings;
  std::vector<Frame> new_frames;
  std::vector<std::pair<int32_t, uint32_t>> new_stacks;
  std::vector<Sample> new_samples;
  uint64_t pass_dropped = 0, pass_torn = 0, pass_missed = 0;

  // The frame reader's (sampler thread only; frames_pass). Its passes change the
  // tables without the GIL: tables_mu keeps a fork from copying them half changed
  // (taken before data_mu; never held while waiting for the GIL).
  std::mutex tables_mu;
  const void* interp = nullptr;
  uint64_t serial = 0;  // passes read
  std::unordered_map<uintptr_t, CodeAt> code_at;
  size_t line_table_bytes = 0;  // in code_at's entries
  std::unordered_map<uint64_t, ThreadSeen> threads_seen;  // by OS thread id
  std::vector<Sample> waiting;  // samples of threads not known yet, oldest first
  int64_t last_lookup_ns = 0;
  std::vector<uint64_t> sampled_tids;  // the last pass's threads (all_asleep)
  std::vector<pyframes::RawThread> raw_threads;
  std::vector<pyframes::RawFrame> raw_frames;};
extern State g_p;

// Ticks of past CLOCK_MONOTONIC times (the instants a quiet sampler slept
// through), from the tick rate the sampler measured since it started.
struct TickRate {
  uint64_t tick0 = 0;
  int64_t ns0 = 0;
  double per_ns(uint64_t tick_now, int64_t ns_now) const {
    return ns_now > ns0 + 1000000 ? double(tick_now - tick0) / double(ns_now - ns0) : 1.0;
  }
  uint64_t at(int64_t ns, uint64_t tick_now, int64_t ns_now) const {
    return tick_now - uint64_t(double(ns_now - ns) * per_ns(tick_now, ns_now));
  }
};

// The GIL walk (pysampler_gilwalk.cc): one pass, by the main thread or the sampler.
bool one_pass(PyThreadState* self, std::chrono::nanoseconds grace, bool offer, int64_t* t1, int64_t* t2);
// The frame reader (pysampler_framereader.cc): one pass without the GIL, then the
// look-up of new threads' names with it.
bool frames_pass(const std::vector<int64_t>& passed, const TickRate& rate);
bool look_up_threads(PyThreadState* self, bool now_or_never, int64_t* t1, int64_t* t2);
// The sampler thread (pysampler.cc): the method a start would use; a start.
bool reads_frames();
std::string start(int hz);

}  // namespace pysampler
}  // namespace stepscope
