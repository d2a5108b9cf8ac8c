// Python stack sampler. A native thread wakes `hz` times a second on average
// (random intervals: see jittered()) and samples every thread's Python stack.
// Two methods. On CPython 3.11-3.13 (GIL builds) it copies the frames without the GIL
// (pyframes.cc; frames_pass() below): samples at times of its own, no thread
// waits for it. Elsewhere, or with STEPSCOPE_PYSAMPLE_METHOD=gil, the GIL walk:
// it takes the GIL (so every other thread is at a safe point), takes each thread's top frame
// from sys._current_frames() (which holds CPython's lock of the thread list:
// see walk()), walks the frames through the C API that CPython 3.9-3.13 all
// have (PyFrame_GetBack, PyFrame_GetCode, PyFrame_GetLineNumber), and releases
// the GIL before anything else: interning is done on thread-local tables,
// handing the pass to the writer takes a mutex only after the GIL is given back.
//
// Samples are wall-clock: a thread blocked in C with the GIL released (torch
// kernels, a queue wait) is sampled where it waits, which is where its time goes.
//
// Strings, frames (function, file, line) and stacks (parent stack, frame: a
// prefix tree, so a stack costs one entry per new leaf) are interned for the
// life of the process, with ids dense from 0; each new trace file gets them
// all again. The GIL walk keeps code objects alive (one reference each) so their
// addresses stay unique keys; the frame reader checks a code address against
// the identity copied at its first sighting (code_at()). Every table is bounded (kMax*): a program that
// makes code as it runs (exec, generated lambdas) sees its newer code as one
// frame, kOtherCode, under its callers, and a stack past the bound is dropped
// and counted; memory stays within a few MiB whatever the program runs.
#include <Python.h>
#if PY_VERSION_HEX < 0x030B0000
#include <frameobject.h>  // PyFrame_GetBack: Python.h declares it only from 3.11
#endif

#include "record/pysampler.h"

#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "common/encoding.h"
#include "common/format.h"
#include "record/pyframes.h"
#include "record/recorder.h"

namespace stepscope {
namespace {

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
  std::vector<pyframes::RawFrame> raw_frames;
} g_p;

uint32_t string_id(const char* s, size_t n) {
  std::string key(s, n);
  auto it = g_p.string_ids.find(key);
  if (it != g_p.string_ids.end()) return it->second;
  const uint32_t id = uint32_t(g_p.strings.size() + g_p.new_strings.size());
  g_p.new_strings.push_back(key);
  g_p.string_ids.emplace(std::move(key), id);
  return id;
}

uint32_t string_of(PyObject* o) {
  Py_ssize_t n = 0;
  const char* s = o && PyUnicode_Check(o) ? PyUnicode_AsUTF8AndSize(o, &n) : nullptr;
  if (!s) {
    PyErr_Clear();  // a name that is not valid UTF-8 (lone surrogates)
    return string_id("?", 1);
  }
  return string_id(s, size_t(n));
}

size_t frame_count() { return g_p.frames.size() + g_p.new_frames.size(); }

// The frame that stands for code the full tables have no room for (the slot kept for it).
uint32_t other_code_frame() {
  if (g_p.other_code == UINT32_MAX) {
    g_p.other_code = uint32_t(frame_count());
    g_p.new_frames.push_back({string_id(kOtherCode, std::strlen(kOtherCode)), string_id("", 0), 0});
  }
  return g_p.other_code;
}

// A new code object's index, or false where the code table is full.
bool new_code(uint32_t func, uint32_t file, uint32_t* ci) {
  if (g_p.code_names.size() >= kMaxCodes || frame_count() + 1 >= kMaxFrames) return false;
  *ci = uint32_t(g_p.code_names.size());
  g_p.code_names.push_back({func, file});
  return true;
}

// The frame id of code ci at instruction lasti; line_of(), which finds the line,
// runs once per distinct (code, instruction), not per sample.
template <typename LineOf>
uint32_t frame_at(uint32_t ci, int lasti, LineOf line_of) {
  const uint64_t at = (uint64_t(ci) << 32) | uint32_t(lasti);
  auto hit = g_p.offset_ids.find(at);
  if (hit != g_p.offset_ids.end()) return hit->second;
  const bool cache = g_p.offset_ids.size() < kMaxOffsets;
  const int line = line_of();
  const uint64_t k = (uint64_t(ci) << 32) | uint32_t(line);
  auto it = g_p.frame_ids.find(k);
  if (it != g_p.frame_ids.end()) {
    if (cache) g_p.offset_ids.emplace(at, it->second);
    return it->second;
  }
  if (frame_count() + 1 >= kMaxFrames) return other_code_frame();
  const CodeNames& names = g_p.code_names[ci];
  const uint32_t id = uint32_t(frame_count());
  g_p.new_frames.push_back({names.func, names.file, line});
  g_p.frame_ids.emplace(k, id);
  if (cache) g_p.offset_ids.emplace(at, id);
  return id;
}

// The GIL walk's frame id: its code objects are kept alive (one reference each)
// so their addresses stay unique keys.
uint32_t frame_id(PyCodeObject* code, PyFrameObject* f) {
  PyObject* key = reinterpret_cast<PyObject*>(code);
  uint32_t ci;
  auto c = g_p.code_index.find(key);
  if (c == g_p.code_index.end()) {
#if PY_VERSION_HEX >= 0x030B0000
    PyObject* name = code->co_qualname;  // Class.method
#else
    PyObject* name = code->co_name;
#endif
    if (!new_code(string_of(name), string_of(code->co_filename), &ci)) return other_code_frame();
    Py_INCREF(key);
    g_p.code_index.emplace(key, ci);
  } else {
    ci = c->second;
  }
#if PY_VERSION_HEX >= 0x030B0000
  const int lasti = PyFrame_GetLasti(f);
#else
  const int lasti = f->f_lasti;
#endif
  return frame_at(ci, lasti, [f] { return PyFrame_GetLineNumber(f); });
}

// A stack's id, or -2 where the table is full (the sample is dropped and counted).
int64_t stack_id(int32_t parent, uint32_t frame) {
  const uint64_t k = (uint64_t(uint32_t(parent + 1)) << 32) | frame;
  auto it = g_p.stack_ids.find(k);
  if (it != g_p.stack_ids.end()) return it->second;
  const size_t n = g_p.stacks.size() + g_p.new_stacks.size();
  if (n >= kMaxStacks) return -2;
  g_p.new_stacks.emplace_back(parent, frame);
  g_p.stack_ids.emplace(k, uint32_t(n));
  return uint32_t(n);
}

// The stack id of frames ids[0..depth), innermost first; -2 where the table is full.
int64_t stack_of(const uint32_t* ids, int depth) {
  int64_t stack = -1;
  for (int i = depth - 1; i >= 0 && stack != -2; --i) stack = stack_id(int32_t(stack), ids[i]);
  return stack;
}

// The OS thread id of a live thread, from its pthread handle (the ident): the
// CPU clock id glibc makes of it encodes the kernel's thread id (Linux's
// MAKE_THREAD_CPUCLOCK: ~tid << 3 | 6). 0 where that is not the encoding.
uint64_t tid_of_pthread(unsigned long ident) {
#ifdef __linux__
  clockid_t cid;
  if (pthread_getcpuclockid(pthread_t(ident), &cid) == 0 && (cid & 7) == 6) {
    const long tid = ~(long(cid) >> 3);
    if (tid > 0) return uint64_t(tid);
  }
#endif
  return 0;
}

// The OS thread id, which the trace's tracks use (threading.get_native_id()):
// threading's registry (a dict of Thread objects by ident; _native_id is a plain
// attribute) knows it for threads that threading started or met. A thread that
// only native code started (one that calls into Python through PyGILState_Ensure:
// autograd's device threads, gloo's) is not there: its pthread handle tells it
// (the thread is alive: it has a Python frame), else its ident stands in. Returns
// 0 for stepscope's own Python threads (named "stepscope-..."): not the job's time.
uint64_t native_id(PyObject* active, PyObject* ident) {
  uint64_t tid = 0;
  const bool names = g_p.native_id_name && g_p.name_name && g_p.own_prefix;
  PyObject* thread = active && names && PyDict_Check(active) ? PyDict_GetItemWithError(active, ident) : nullptr;
  if (thread) {
    if (PyObject* name = PyObject_GetAttr(thread, g_p.name_name)) {
      const bool ours = PyUnicode_Check(name) && PyUnicode_Tailmatch(name, g_p.own_prefix, 0, PY_SSIZE_T_MAX, -1) == 1;
      Py_DECREF(name);
      if (ours) return 0;
    }
    if (PyObject* n = PyObject_GetAttr(thread, g_p.native_id_name)) {
      tid = PyLong_Check(n) ? PyLong_AsUnsignedLongLong(n) : 0;
      Py_DECREF(n);
    }
  }
  PyErr_Clear();
  if (tid == uint64_t(-1) || tid == 0) {
    const unsigned long handle = PyLong_AsUnsignedLong(ident);
    tid = PyErr_Occurred() ? 0 : tid_of_pthread(handle);
    PyErr_Clear();
    if (tid == 0) tid = handle;
  }
  return tid == uint64_t(-1) ? 0 : tid;
}

// One pass with the GIL held: every thread with a Python frame, but ours.
//
// The frames come from sys._current_frames(), which walks the interpreter's
// thread states under CPython's own lock of that list. The GIL alone does not
// make that walk safe: a thread that native code started creates its thread
// state (PyGILState_Ensure, pybind11's gil_scoped_acquire) without holding the
// GIL, and a sampler that walked the list itself read one half made and crashed
// (seen in a Lightning DDP job on gloo: SIGSEGV in PyThreadState_GetFrame).
void walk() {
  const uint64_t tick = ticks();
  PyObject* current_frames = PySys_GetObject("_current_frames");  // borrowed
  PyObject* frames = current_frames ? PyObject_CallNoArgs(current_frames) : nullptr;
  if (!frames || !PyDict_Check(frames)) {
    Py_XDECREF(frames);
    PyErr_Clear();
    return;
  }
  PyObject* threading = g_p.threading_name ? PyImport_GetModule(g_p.threading_name) : nullptr;  // new ref
  PyObject* active = threading && g_p.active_name ? PyObject_GetAttr(threading, g_p.active_name) : nullptr;
  PyErr_Clear();
  const unsigned long self = g_p.sampler_ident;
  uint32_t ids[kMaxDepth];
  PyObject *ident, *top;
  Py_ssize_t pos = 0;
  while (PyDict_Next(frames, &pos, &ident, &top)) {
    if (PyLong_AsUnsignedLong(ident) == self || !PyFrame_Check(top)) {
      PyErr_Clear();
      continue;
    }
    const uint64_t tid = native_id(active, ident);
    if (tid == 0) continue;  // stepscope's own thread
    PyFrameObject* f = reinterpret_cast<PyFrameObject*>(top);
    Py_INCREF(f);
    int depth = 0;
    while (f) {
      PyCodeObject* code = PyFrame_GetCode(f);
      if (depth < kMaxDepth) ids[depth++] = frame_id(code, f);
      Py_DECREF(code);
      PyFrameObject* back = PyFrame_GetBack(f);
      Py_DECREF(f);
      f = back;
      if (depth == kMaxDepth) {  // keep the innermost frames: that is where the time goes
        Py_XDECREF(f);
        break;
      }
    }
    const int64_t stack = stack_of(ids, depth);
    if (stack < 0) {
      ++g_p.pass_dropped;  // the stack table is full
      continue;
    }
    g_p.new_samples.push_back({tick, tid, uint32_t(stack)});
  }
  Py_XDECREF(active);
  Py_XDECREF(threading);
  Py_DECREF(frames);
}

// ------------------------------------------------- frames read without the GIL
//
// The frame reader (pyframes.cc) copies every thread's frames at the pass's own
// time, whatever the threads are doing: a thread running pure Python is sampled
// there, and no thread waits for the sampler (issue 45: a pass that needs the GIL
// is taken when the program gives it up, which biases what it sees). Code objects
// are not kept alive: a code address is checked against the identity copied at
// its first sighting once per pass that meets it, and a new code object at a dead
// one's address gets an entry (and names) of its own. Only whose a new thread is
// (the job's, or stepscope's own "stepscope-..." threads: threading's registry)
// needs the GIL: its samples wait for that look-up, rate-limited (kLookupEveryNs).

// The code object at addr as this pass sees it; null where addr is no code object
// (a frame torn down under the read).
// `read` is its identity copied this pass already (check_codes), or null.
const CodeAt* code_at(uintptr_t addr, const pyframes::Code* read = nullptr) {
  auto it = g_p.code_at.find(addr);
  if (it != g_p.code_at.end() && it->second.checked == g_p.serial) return &it->second;
  pyframes::Code now;
  if (read) now = *read;
  else if (!pyframes::read_identity(addr, &now)) return nullptr;
  if (it != g_p.code_at.end() && pyframes::same_identity(it->second.code, now)) {
    it->second.checked = g_p.serial;
    return &it->second;
  }
  static CodeAt scratch;  // a code object the address table has no room for
  CodeAt& entry = it != g_p.code_at.end() ? it->second
                  : g_p.code_at.size() < kMaxCodeAddresses ? g_p.code_at[addr] : scratch;
  g_p.line_table_bytes -= entry.code.line_table.size();
  entry = CodeAt{};
  entry.checked = g_p.serial;
  if (!pyframes::read_names(addr, &entry.code)) return nullptr;
  const std::string& q = entry.code.qualname;
  const std::string& f = entry.code.filename;
  if (!new_code(string_id(q.data(), q.size()), string_id(f.data(), f.size()), &entry.ci)) {
    entry.ci = UINT32_MAX;
    entry.code.line_table = {};  // its frames are all kOtherCode
  }
  if (g_p.line_table_bytes + entry.code.line_table.size() > kMaxLineTableBytes)
    entry.code.line_table = {};  // its frames are at its first line
  if (&entry == &scratch) scratch.code.line_table = {};
  g_p.line_table_bytes += entry.code.line_table.size();
  return &entry;
}

// The thread's entry (new threads: not known yet, their kind looked up later).
ThreadSeen& thread_seen(unsigned long ident, uint64_t tid) {
  auto it = g_p.threads_seen.find(tid);
  if (it != g_p.threads_seen.end() && it->second.ident == ident) return it->second;
  if (g_p.threads_seen.size() >= kMaxThreadsSeen) g_p.threads_seen.clear();
  ThreadSeen& t = g_p.threads_seen[tid];
  t = ThreadSeen{ident, kUnknownThread};
  return t;
}

// A thread's CPU time (ns) from its OS thread id, -1 when it is gone. The clock
// id is Linux's MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED): a pthread handle is
// not needed, so a thread that ended is an error, not undefined behaviour.
int64_t thread_cpu_ns(uint64_t tid) {
#ifdef __linux__
  const clockid_t cid = clockid_t((~clockid_t(tid)) * 8 + 6);
  timespec ts;
  if (clock_gettime(cid, &ts) == 0) return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
#endif
  return -1;
}

// Whether to copy a thread's frames this pass. Not stepscope's own threads'; and
// not those of a thread whose CPU clock has not moved since they were read: a
// thread that has not run has not changed its frames (no other thread changes
// them), so its last stack is its stack now. Waiting threads (a DataLoader's
// queue threads, a main thread blocked in join) then cost a clock read a pass.
bool want_frames(unsigned long ident, uint64_t tid) {
  ThreadSeen& t = thread_seen(ident, tid);
  if (t.kind == kOwnThread) return false;
  const int64_t cpu = thread_cpu_ns(tid);
  const bool still = cpu >= 0 && cpu == t.cpu_ns && t.stack >= 0;
  t.cpu_ns = cpu;
  return !still;
}

// One thread's stack id from its copied frames; -1: torn (a frame changed under
// the read), -2: the tables are full, -3: no complete frame.
// Checks the thread's code objects not checked yet this pass, in one vectored
// copy (a copy per code object cost ~1.5 us each on the development VM).
void check_codes(const pyframes::RawThread& t) {
  static std::vector<uintptr_t> addrs;
  static std::vector<pyframes::Code> codes;
  static std::unique_ptr<bool[]> ok;
  static size_t ok_size = 0;
  addrs.clear();
  for (uint32_t i = 0; i < t.count; ++i) {
    const uintptr_t a = g_p.raw_frames[t.first + i].code;
    auto it = g_p.code_at.find(a);
    if ((it == g_p.code_at.end() || it->second.checked != g_p.serial) &&
        std::find(addrs.begin(), addrs.end(), a) == addrs.end())
      addrs.push_back(a);
  }
  if (addrs.size() < 2) return;  // code_at reads a lone one itself
  codes.resize(addrs.size());
  if (ok_size < addrs.size()) ok.reset(new bool[ok_size = addrs.size()]);
  pyframes::read_identities(addrs.data(), addrs.size(), codes.data(), ok.get());
  for (size_t i = 0; i < addrs.size(); ++i)
    if (ok[i]) code_at(addrs[i], &codes[i]);  // (not a code object: code_at finds it so again)
}

int64_t read_stack(const pyframes::RawThread& t, uint64_t max_read_ticks) {
  // A copy that took long (the sampler descheduled in it, on a loaded machine) shows
  // frames of its start at times well after it: torn (a stack of the previous
  // step's Loss showed in the next step's zero_grad so, 1 sample in ~200).
  if (t.read_ticks > max_read_ticks) return -1;
  uint32_t ids[kMaxDepth];
  int depth = 0;
  check_codes(t);
  for (uint32_t i = 0; i < t.count && depth < kMaxDepth; ++i) {
    const pyframes::RawFrame& rf = g_p.raw_frames[t.first + i];
    const CodeAt* c = code_at(rf.code);
    if (!c || rf.lasti == INT32_MIN || rf.lasti >= c->code.size) return -1;
    if (!rf.generator && rf.lasti < c->code.first_traceable) continue;  // still being set up
    if (c->ci == UINT32_MAX) {
      ids[depth++] = other_code_frame();
      continue;
    }
    const int lasti = rf.lasti;
    ids[depth++] = frame_at(c->ci, lasti, [c, lasti] { return pyframes::line_at(c->code, lasti); });
  }
  return depth ? stack_of(ids, depth) : -3;
}

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

// One pass without the GIL: every thread with a Python frame, but stepscope's own.
// `passed` are the instants (CLOCK_MONOTONIC ns) a quiet sampler slept through
// since the last pass: a thread that has not run since then was where it is now
// at each of them, and gets their samples too; one that ran loses them (counted:
// missed). Returns whether no thread ran (every stack known without a copy).
bool frames_pass(const std::vector<int64_t>& passed, const TickRate& rate) {
  ++g_p.serial;
  const uint64_t max_read_ticks = uint64_t(rate.per_ns(ticks(), mono_ns()) * double(kMaxReadNs));
  g_p.raw_threads.clear();
  g_p.raw_frames.clear();
  pyframes::read_threads(g_p.interp, kMaxDepth, [] { return ticks(); }, want_frames, g_p.raw_threads,
                         g_p.raw_frames);
  const uint64_t tick_now = ticks();
  const int64_t ns_now = mono_ns();
  bool still = true;
  g_p.sampled_tids.clear();
  for (const pyframes::RawThread& t : g_p.raw_threads) {
    if (t.tid == 0 || t.ident == g_p.sampler_ident) continue;
    ThreadSeen& seen = thread_seen(t.ident, t.tid);
    const int kind = seen.kind;
    if (kind == kOwnThread) continue;
    g_p.sampled_tids.push_back(t.tid);
    still = still && !t.copied;
    int64_t stack = t.copied ? read_stack(t, max_read_ticks) : seen.stack;
    // Torn: the thread changed its frames under the copy (a generator resumed, a
    // code object freed). Dropping the sample would under-count code that changes
    // its frames fastest; a copy again, microseconds later, rarely tears twice.
    uint64_t when = t.when;
    pyframes::RawThread again;
    for (int i = 0; i < kRereads && stack == -1 && t.copied; ++i)
      if (pyframes::read_thread_again(t, kMaxDepth, [] { return ticks(); }, &again, g_p.raw_frames)) {
        stack = read_stack(again, max_read_ticks);
        when = again.when;
      }
    seen.stack = stack >= 0 ? stack : -1;
    if (stack == -1) {
      ++g_p.pass_torn;
    } else if (stack == -2) {
      ++g_p.pass_dropped;
    } else if (stack >= 0) {
      std::vector<Sample>& to = kind == kUnknownThread ? g_p.waiting : g_p.new_samples;
      if (t.copied) g_p.pass_missed += passed.size();
      else
        for (int64_t ns : passed) to.push_back({rate.at(ns, tick_now, ns_now), t.tid, uint32_t(stack)});
      to.push_back({when, t.tid, uint32_t(stack)});
      if (g_p.waiting.size() > kMaxPending) {
        g_p.pass_dropped += g_p.waiting.size() - kMaxPending;
        g_p.waiting.resize(kMaxPending);
      }
    }
  }
  return still;
}

// Whether the thread with this ident is one of stepscope's own (threading knows it
// by a "stepscope-..." name): 1; the job's: 0; not in threading's registry: 2. GIL held.
int own_thread(PyObject* active, unsigned long ident) {
  if (!active || !PyDict_Check(active) || !g_p.name_name || !g_p.own_prefix) return 0;
  PyObject* key = PyLong_FromUnsignedLong(ident);
  PyObject* thread = key ? PyDict_GetItemWithError(active, key) : nullptr;  // borrowed
  Py_XDECREF(key);
  int own = thread ? 0 : 2;
  if (thread) {
    if (PyObject* name = PyObject_GetAttr(thread, g_p.name_name)) {
      own = PyUnicode_Check(name) && PyUnicode_Tailmatch(name, g_p.own_prefix, 0, PY_SSIZE_T_MAX, -1) == 1;
      Py_DECREF(name);
    }
  }
  PyErr_Clear();
  return own;
}

// Looks up the threads met since the last look-up (with the GIL: threading's
// registry), then hands their waiting samples on, or drops our own threads'.
// At most every kLookupEveryNs unless now_or_never (the sampler stops). Returns
// whether it took the GIL; fills t1/t2 (the hold).
bool look_up_threads(PyThreadState* self, bool now_or_never, int64_t* t1, int64_t* t2) {
  std::vector<std::pair<uint64_t, unsigned long>> unknown;  // (tid, ident)
  {
    std::lock_guard<std::mutex> tl(g_p.tables_mu);
    if (g_p.waiting.empty() || SS_FINALIZING()) return false;
    if (!now_or_never && mono_ns() - g_p.last_lookup_ns < kLookupEveryNs) return false;
    for (const auto& [tid, seen] : g_p.threads_seen)
      if (seen.kind == kUnknownThread) unknown.emplace_back(tid, seen.ident);
  }
  std::vector<char> own(unknown.size(), 0);  // 1: ours, 0: the job's, 2: not registered yet
  PyEval_RestoreThread(self);
  *t1 = mono_ns();
  PyObject* threading = g_p.threading_name ? PyImport_GetModule(g_p.threading_name) : nullptr;
  PyObject* active = threading && g_p.active_name ? PyObject_GetAttr(threading, g_p.active_name) : nullptr;
  PyErr_Clear();
  for (size_t i = 0; i < unknown.size(); ++i) own[i] = char(own_thread(active, unknown[i].second));
  Py_XDECREF(active);
  Py_XDECREF(threading);
  PyEval_SaveThread();
  *t2 = mono_ns();
  std::lock_guard<std::mutex> tl(g_p.tables_mu);
  g_p.last_lookup_ns = *t2;
  for (size_t i = 0; i < unknown.size(); ++i) {
    auto it = g_p.threads_seen.find(unknown[i].first);
    if (it == g_p.threads_seen.end() || it->second.ident != unknown[i].second) continue;
    // A thread threading started may not be in its registry yet (it registers in
    // _bootstrap_inner): asked again, kLookups times, before it counts as the job's.
    if (own[i] == 2 && !now_or_never && ++it->second.lookups < kLookups) continue;
    it->second.kind = own[i] == 1 ? kOwnThread : kJobThread;
  }
  std::vector<Sample> ready, still;
  for (const Sample& s : g_p.waiting) {
    auto it = g_p.threads_seen.find(s.tid);
    const int kind = it == g_p.threads_seen.end() ? kJobThread : it->second.kind;
    if (kind == kJobThread) ready.push_back(s);
    else if (kind == kUnknownThread) still.push_back(s);  // met while we looked the others up
  }
  g_p.waiting.swap(still);
  g_p.new_samples.insert(g_p.new_samples.begin(), ready.begin(), ready.end());  // older than this pass's
  return true;
}

// The pending call: the main thread walks the pass itself, at its next eval-breaker
// check, with the GIL it already holds. Runs only if the pass is still armed (the
// sampler may have claimed it, or stopped). Never raises into the job.
int main_walk(void*) {
  g_p.queued.store(false);
  int armed = kArmed;
  if (!g_p.pass.compare_exchange_strong(armed, kInMain)) return 0;
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  g_p.main_t1 = mono_ns();
  try {
    walk();
  } catch (...) {  // std::bad_alloc in the tables: the pass is lost, the job goes on
  }
  g_p.main_t2 = mono_ns();
  PyErr_Restore(type, value, traceback);
  {
    std::lock_guard<std::mutex> pl(g_p.pass_mu);
    g_p.pass.store(kDone);
  }
  g_p.pass_cv.notify_one();
  return 0;
}

// One pass, walked by whichever thread costs the job less. The sampler first asks
// the main thread through Py_AddPendingCall: the main thread runs it when it next
// takes the GIL back (after a torch op: microseconds in a training loop) and walks
// with the GIL it holds, no hand-over. Taking the GIL from here instead makes the
// main thread, back from its op, wait for our walk and a thread wake-up (~60 us a
// pass on the development VM, 3-4 us a step at 100 Hz; BENCHMARKS.md). If the main
// thread does not come by within the grace period (blocked in C with the GIL
// released, or running pure Python that releases nothing), the sampler claims the
// pass and takes the GIL itself, as it always did: free in the first case, the
// 5 ms switch interval in the second. (On 3.11 a pending call added from another
// thread does not trip the main thread's eval breaker; its next GIL take does.)
// A main thread that did not come by is asked again only every kRetry passes
// (while it is away, each offer would cost the grace period's delay, and on 3.12+
// other threads trip their eval breaker until the main thread runs the call).
// Fills t1/t2 (the walk) and returns whether the main thread walked it.
bool one_pass(PyThreadState* self, std::chrono::nanoseconds grace, bool offer, int64_t* t1, int64_t* t2) {
  g_p.pass.store(kArmed);
  if (offer) {
    if (!g_p.queued.exchange(true) && Py_AddPendingCall(main_walk, nullptr) != 0) g_p.queued.store(false);
    std::unique_lock<std::mutex> pl(g_p.pass_mu);
    g_p.pass_cv.wait_for(pl, grace, [] { return g_p.pass.load() == kDone; });
  }
  int armed = kArmed;
  if (g_p.pass.compare_exchange_strong(armed, kSampler)) {
    PyEval_RestoreThread(self);
    *t1 = mono_ns();
    walk();
    PyEval_SaveThread();
    *t2 = mono_ns();
    g_p.pass.store(kIdle);
    return false;
  }
  {
    std::unique_lock<std::mutex> pl(g_p.pass_mu);  // the main thread is walking: a few microseconds
    g_p.pass_cv.wait(pl, [] { return g_p.pass.load() == kDone; });
  }
  *t1 = g_p.main_t1;
  *t2 = g_p.main_t2;
  g_p.pass.store(kIdle);
  return true;
}

// The frame reader samples when it wakes: a sampler that waits for a free core
// tends to run as the job blocks and frees one, and over-counts blocking code
// (measured on a 2-core VM at load 5: a 75% pure-Python share sampled at 60%).
// The lowest real-time priority (SCHED_FIFO 1) wakes it on time: it sleeps all
// but ~20 us a pass, and the kernel's real-time throttling bounds it regardless.
// Where the process may not (no CAP_SYS_NICE, RLIMIT_RTPRIO 0) it stays as it is;
// STEPSCOPE_PYSAMPLE_RT=0 leaves it as it is anyway.
void wake_on_time() {
  const char* rt = std::getenv("STEPSCOPE_PYSAMPLE_RT");
  if (rt && std::strcmp(rt, "0") == 0) return;
  sched_param p{};
  p.sched_priority = 1;
  g_p.realtime = pthread_setschedparam(pthread_self(), SCHED_FIFO, &p) == 0;
}

// The next interval: uniform in [interval/2, 3*interval/2), the mean rate kept. A
// fixed period locks onto a loop on a fixed schedule (a 30 ms step sampled every
// 10 ms sees the same three moments of every step: a 3 ms helper was measured at
// 4.7% of the samples for 11.4% of the time); random phases cannot.
std::chrono::nanoseconds jittered(std::chrono::nanoseconds interval, uint64_t* rng) {
  uint64_t x = *rng;  // xorshift64
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  *rng = x;
  const int64_t n = interval.count();
  return std::chrono::nanoseconds(n / 2 + int64_t(x % uint64_t(n > 0 ? n : 1)));
}

// Whether every thread the last pass sampled is asleep (blocked: S or D in
// /proc), not merely kept off a core: a runnable thread starved for the
// kQuietPasses passes would run as soon as it gets one, and lose samples.
bool all_asleep() {
  for (uint64_t tid : g_p.sampled_tids) {
    char path[64], buf[512];
    std::snprintf(path, sizeof path, "/proc/self/task/%llu/stat", (unsigned long long)tid);
    FILE* f = std::fopen(path, "re");
    if (!f) continue;  // gone
    const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
    std::fclose(f);
    buf[n] = 0;
    const char* close = std::strrchr(buf, ')');  // the name may hold spaces and parentheses
    if (!close || close[1] != ' ' || (close[2] != 'S' && close[2] != 'D')) return false;
  }
  return true;
}

// Hands a pass's additions to the writer (the mutex it shares with the writer only).
void publish(int passes, bool late, bool by_main, bool took_gil, int64_t wait_ns, int64_t hold_ns) {
  {
    std::lock_guard<std::mutex> dl(g_p.data_mu);
    for (auto& s : g_p.new_strings) g_p.strings.push_back(std::move(s));
    g_p.frames.insert(g_p.frames.end(), g_p.new_frames.begin(), g_p.new_frames.end());
    g_p.stacks.insert(g_p.stacks.end(), g_p.new_stacks.begin(), g_p.new_stacks.end());
    const size_t room = g_p.samples.size() < kMaxPending ? kMaxPending - g_p.samples.size() : 0;
    const size_t take = std::min(room, g_p.new_samples.size());
    g_p.samples.insert(g_p.samples.end(), g_p.new_samples.begin(), g_p.new_samples.begin() + long(take));
    g_p.dropped += g_p.new_samples.size() - take + g_p.pass_dropped;
    g_p.torn += g_p.pass_torn;
    g_p.missed += g_p.pass_missed;
    g_p.pass_dropped = g_p.pass_torn = g_p.pass_missed = 0;
    g_p.taken += take;
    g_p.passes += passes;
    g_p.late += late;
    g_p.main_passes += by_main;
    g_p.gil_passes += took_gil;
    g_p.gil_wait_ns += wait_ns;
    g_p.hold_ns += hold_ns;
  }
  g_p.new_strings.clear();
  g_p.new_frames.clear();
  g_p.new_stacks.clear();
  g_p.new_samples.clear();
}

void* sampler_main(void*) {
  pthread_setname_np(pthread_self(), "stepscope-pysmp");
  if (g_p.read_frames) wake_on_time();
  if (SS_FINALIZING()) return nullptr;
  // A thread state of our own, made once: per-sample PyGILState_Ensure/Release
  // pairs would create and destroy one at every pass.
  PyGILState_STATE gil = PyGILState_Ensure();
  PyThreadState* self = PyThreadState_Get();
  g_p.sampler_ident = PyThread_get_thread_ident();
  if (!g_p.threading_name) g_p.threading_name = PyUnicode_InternFromString("threading");
  if (!g_p.native_id_name) g_p.native_id_name = PyUnicode_InternFromString("_native_id");
  if (!g_p.active_name) g_p.active_name = PyUnicode_InternFromString("_active");
  if (!g_p.name_name) g_p.name_name = PyUnicode_InternFromString("_name");
  if (!g_p.own_prefix) g_p.own_prefix = PyUnicode_InternFromString("stepscope-");
  PyEval_SaveThread();
  auto next = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lk(g_p.mu);
  const auto interval = std::chrono::nanoseconds(1000000000 / g_p.hz);
  const auto grace = std::min(interval / 4, std::chrono::nanoseconds(2000000));
  unsigned since_miss = 0;  // passes since the main thread last walked one (0: it walked the last)
  uint64_t rng = uint64_t(mono_ns()) | 1;
  int quiet = 0;                // the frame reader's passes in a row in which no thread ran
  std::vector<int64_t> passed;  // instants slept through since (CLOCK_MONOTONIC ns)
  TickRate rate{ticks(), mono_ns()};
  while (!g_p.stop) {
    lk.unlock();
    // Never take the GIL once finalization began: a daemon thread that does
    // is made to exit inside PyEval_RestoreThread (3.9-3.13).
    if (SS_FINALIZING()) break;
    const int64_t t0 = mono_ns();
    int64_t t1 = t0, t2 = t0;
    bool by_main = false, took_gil = false;
    int64_t read_ns = 0;  // the frame reader's pass, without the GIL
    // Woken late: no core was free at the pass's time. The pass then tends to run
    // when a core frees up, often as the job blocks: shares lean to blocking code.
    const bool late = std::chrono::steady_clock::now() - next > std::max(interval / 10, kLate);
    if (g_p.read_frames) {
      {
        std::lock_guard<std::mutex> tl(g_p.tables_mu);
        quiet = frames_pass(passed, rate) ? quiet + 1 : 0;
      }
      const int64_t asked = mono_ns();
      read_ns = asked - t0;
      int64_t h1 = asked, h2 = asked;
      took_gil = look_up_threads(self, false, &h1, &h2);
      t1 = t0 + (h1 - asked);  // the wait for the GIL, and its hold: not the read
      t2 = t1 + (h2 - h1);
    } else {
      by_main = one_pass(self, grace, since_miss == 0 || since_miss % kRetry == 0, &t1, &t2);
      since_miss = by_main ? 0 : since_miss + 1;
      took_gil = !by_main;
    }
    {
      std::lock_guard<std::mutex> tl(g_p.tables_mu);
      publish(1, late, by_main, took_gil, t1 - t0, t2 - t1);
      g_p.read_ns += read_ns;  // (tables_mu: the sampler's; status reads it as a plain counter)
    }
    lk.lock();
    next += jittered(interval, &rng);
    passed.clear();
    if (quiet == kQuietPasses && !all_asleep()) quiet = 0;  // (checked as it turns quiet: /proc is dear)
    if (quiet >= kQuietPasses) {  // sleep through the next kQuietSpan's instants (see frames_pass)
      const auto horizon = next + kQuietSpan;
      for (auto after = next + jittered(interval, &rng); after <= horizon; after += jittered(interval, &rng)) {
        passed.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(next.time_since_epoch()).count());
        next = after;
      }
    }
    const auto now = std::chrono::steady_clock::now();
    if (next < now) next = now;  // fell behind (a long GIL wait): skip, never burst
    g_p.cv.wait_until(lk, next, [] { return g_p.stop; });
  }
  if (lk.owns_lock()) lk.unlock();
  if (g_p.read_frames) {  // the last samples of threads not looked up yet
    int64_t t1 = 0, t2 = 0;
    const bool took_gil = look_up_threads(self, true, &t1, &t2);
    std::lock_guard<std::mutex> tl(g_p.tables_mu);
    g_p.waiting.clear();
    publish(0, false, false, took_gil, 0, t2 - t1);
  }
  if (!SS_FINALIZING()) {
    PyEval_RestoreThread(self);
    PyGILState_Release(gil);  // deletes our thread state
  }
  return nullptr;
}

// Fork: the sampler thread does not exist in the child; its state is dropped
// without joining, and the child starts none unless it starts a session of its own.
void at_fork_prepare() {
  g_p.tables_mu.lock();
  g_p.data_mu.lock();
}
void at_fork_parent() {
  g_p.data_mu.unlock();
  g_p.tables_mu.unlock();
}
void at_fork_child() {
  new (&g_p.tables_mu) std::mutex();
  g_p.threads_seen.clear();  // the child's threads are not the parent's
  g_p.waiting.clear();
  g_p.last_lookup_ns = 0;
  new (&g_p.mu) std::mutex();
  new (&g_p.cv) std::condition_variable();
  new (&g_p.data_mu) std::mutex();
  g_p.thread = pthread_t{};
  g_p.running = false;
  g_p.stop = false;
  g_p.samples.clear();  // the parent's samples are the parent's
  g_p.new_samples.clear();
  g_p.strings_written = g_p.frames_written = g_p.stacks_written = 0;
  g_p.taken = g_p.dropped = g_p.passes = g_p.bytes = g_p.pass_dropped = 0;
  g_p.gil_wait_ns = g_p.hold_ns = 0;
  g_p.read_ns = 0;
  g_p.main_passes = g_p.gil_passes = g_p.torn = g_p.pass_torn = g_p.late = g_p.missed = g_p.pass_missed = 0;
  g_p.owner = 0;
  new (&g_p.pass_mu) std::mutex();
  new (&g_p.pass_cv) std::condition_variable();
  g_p.pass.store(kIdle);
  g_p.queued.store(false);  // a call left in CPython's queue finds the pass idle
}

// The method a start uses: frames read without the GIL where this build knows
// the frame layout and the process may copy its own memory, unless
// STEPSCOPE_PYSAMPLE_METHOD=gil asks for the GIL walk (a comparison, a fallback).
bool reads_frames() {
  const char* method = std::getenv("STEPSCOPE_PYSAMPLE_METHOD");
  if (method && std::strcmp(method, "gil") == 0) return false;
  return pyframes::compiled_in() && pyframes::usable();
}

std::string start(int hz) {
#ifdef Py_GIL_DISABLED
  // Without a GIL, holding "the GIL" does not stop the other threads: their frames could change mid-walk.
  if (hz > 0) return "not supported on a free-threaded (no GIL) Python build";
#endif
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(at_fork_prepare, at_fork_parent, at_fork_child); });
  stop_pysampler();
  if (hz <= 0) return {};
  {
    std::lock_guard<std::mutex> dl(g_p.data_mu);
    g_p.samples.clear();
    // A new trace file: every string, frame and stack is written into it again.
    g_p.strings_written = g_p.frames_written = g_p.stacks_written = 0;
    g_p.taken = g_p.dropped = g_p.passes = g_p.bytes = g_p.main_passes = 0;
    g_p.gil_passes = g_p.torn = g_p.late = g_p.missed = 0;
    g_p.gil_wait_ns = g_p.hold_ns = 0;
    g_p.read_ns = 0;
  }
  std::lock_guard<std::mutex> lk(g_p.mu);
  g_p.read_frames = reads_frames();
  g_p.hz = hz;
  g_p.stop = false;
  g_p.owner = getpid();
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, size_t(1) << 20);
  const int err = pthread_create(&g_p.thread, &attr, sampler_main, nullptr);
  pthread_attr_destroy(&attr);
  if (err != 0) return std::string("cannot start the Python sampler thread: ") + std::strerror(err);
  g_p.running = true;
  return {};
}

// ------------------------------------------------------------ Python API

PyObject* py_start(PyObject*, PyObject* arg) {
  const long hz = PyLong_AsLong(arg);
  if (hz == -1 && PyErr_Occurred()) return nullptr;
  std::string err;
  g_p.interp = PyInterpreterState_Get();  // the sampler reads this interpreter's threads
  Py_BEGIN_ALLOW_THREADS  // stopping a running sampler joins a thread that may wait for the GIL
  err = start(int(hz));
  Py_END_ALLOW_THREADS
  return PyUnicode_FromStringAndSize(err.data(), Py_ssize_t(err.size()));
}

PyObject* py_stop(PyObject*, PyObject*) {
  Py_BEGIN_ALLOW_THREADS
  stop_pysampler();
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

PyObject* py_status(PyObject*, PyObject*) {
  bool running;
  int hz;
  pid_t owner;
  int64_t cpu_ns = -1;
  {
    std::lock_guard<std::mutex> lk(g_p.mu);
    running = g_p.running;
    hz = g_p.hz;
    owner = g_p.owner;
    clockid_t cid;
    timespec ts;
    if (running && pthread_getcpuclockid(g_p.thread, &cid) == 0 && clock_gettime(cid, &ts) == 0)
      cpu_ns = int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
  }
  const char* method = (running ? g_p.read_frames : reads_frames()) ? "frames" : "gil";
  const bool realtime = running && g_p.realtime;
  std::lock_guard<std::mutex> dl(g_p.data_mu);
  return Py_BuildValue("{s:O,s:O,s:i,s:i,s:s,s:L,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:L,s:L,s:L,s:n,s:n,s:n}", "running",
                       running ? Py_True : Py_False, "realtime", realtime ? Py_True : Py_False, "hz", hz, "pid", int(owner), "method", method, "read_ns", (long long)g_p.read_ns.load(), "samples",
                       (unsigned long long)g_p.taken, "dropped", (unsigned long long)g_p.dropped, "torn",
                       (unsigned long long)g_p.torn, "missed", (unsigned long long)g_p.missed, "passes", (unsigned long long)g_p.passes, "late",
                       (unsigned long long)g_p.late, "main_passes",
                       (unsigned long long)g_p.main_passes, "gil_passes", (unsigned long long)g_p.gil_passes,
                       "bytes", (unsigned long long)g_p.bytes, "cpu_ns", (long long)cpu_ns, "gil_wait_ns",
                       (long long)g_p.gil_wait_ns, "hold_ns", (long long)g_p.hold_ns, "strings",
                       Py_ssize_t(g_p.strings.size()), "frames", Py_ssize_t(g_p.frames.size()), "stacks",
                       Py_ssize_t(g_p.stacks.size()));
}

// For tests: the line of every instruction of a code object as the frame reader
// decodes it from a copy of its line table (compare with code.co_lines()); None
// where this build does not read frames.
PyObject* py_lines(PyObject*, PyObject* code) {
  if (!PyCode_Check(code)) {
    PyErr_SetString(PyExc_TypeError, "a code object");
    return nullptr;
  }
  pyframes::Code c;
  if (!pyframes::compiled_in() || !pyframes::usable() || !pyframes::read_names(uintptr_t(code), &c)) Py_RETURN_NONE;
  PyObject* out = PyList_New(c.size);
  for (int32_t i = 0; out && i < c.size; ++i) PyList_SET_ITEM(out, i, PyLong_FromLong(pyframes::line_at(c, i)));
  return out;
}

PyMethodDef g_methods[] = {
    {"pysampler_start", py_start, METH_O,
     "pysampler_start(hz): samples every thread's Python stack hz times a second; '' or the reason it cannot"},
    {"pysampler_stop", py_stop, METH_NOARGS, "Stops the Python stack sampler (its samples reach the trace)."},
    {"pysampler_status", py_status, METH_NOARGS,
     "The Python sampler's state and counters (samples, dropped, bytes, the thread's CPU time)."},
    {"_pysampler_lines", py_lines, METH_O, "For tests: a code object's lines per instruction, as the frame reader reads them."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

PyMethodDef* pysampler_methods() { return g_methods; }

void stop_pysampler() {
  pthread_t thread;
  {
    std::lock_guard<std::mutex> lk(g_p.mu);
    if (!g_p.running) return;
    g_p.stop = true;
    g_p.running = false;
    thread = g_p.thread;
  }
  g_p.cv.notify_all();
  pthread_join(thread, nullptr);
}

// PYSTACKS: first string id, count, (len, bytes)...; first frame id, count,
// (function, file, line)...; first stack id, count, (parent + 1, frame)...
// PYSAMPLES: interval_ns, count, thread count, OS thread ids..., base_ns, then
// per sample zigzag(time - previous time), thread index, stack id.
void encode_pysamples(std::string& out) {
  std::vector<std::string> strings;
  std::vector<Frame> frames;
  std::vector<std::pair<int32_t, uint32_t>> stacks;
  std::vector<Sample> samples;
  size_t s0, f0, k0;
  int hz;
  {
    std::lock_guard<std::mutex> lk(g_p.mu);
    hz = g_p.hz;
  }
  {
    std::lock_guard<std::mutex> dl(g_p.data_mu);
    if (g_p.samples.empty() && g_p.strings_written == g_p.strings.size() &&
        g_p.frames_written == g_p.frames.size() && g_p.stacks_written == g_p.stacks.size())
      return;
    s0 = g_p.strings_written;
    f0 = g_p.frames_written;
    k0 = g_p.stacks_written;
    strings.assign(g_p.strings.begin() + long(s0), g_p.strings.end());
    frames.assign(g_p.frames.begin() + long(f0), g_p.frames.end());
    stacks.assign(g_p.stacks.begin() + long(k0), g_p.stacks.end());
    g_p.strings_written = g_p.strings.size();
    g_p.frames_written = g_p.frames.size();
    g_p.stacks_written = g_p.stacks.size();
    samples.swap(g_p.samples);
  }
  const size_t before = out.size();
  if (!strings.empty() || !frames.empty() || !stacks.empty()) {
    std::string p;
    put_varint(p, s0);
    put_varint(p, strings.size());
    for (const std::string& s : strings) {
      put_varint(p, s.size());
      p += s;
    }
    put_varint(p, f0);
    put_varint(p, frames.size());
    for (const Frame& f : frames) {
      put_varint(p, f.func);
      put_varint(p, f.file);
      put_varint(p, zigzag(f.line));
    }
    put_varint(p, k0);
    put_varint(p, stacks.size());
    for (const auto& [parent, frame] : stacks) {
      put_varint(p, uint64_t(int64_t(parent) + 1));
      put_varint(p, frame);
    }
    append_chunk(out, kChunkPyStacks, p);
  }
  if (!samples.empty()) {
    std::vector<uint64_t> tids;
    std::unordered_map<uint64_t, uint32_t> index;
    for (const Sample& s : samples)
      if (index.emplace(s.tid, uint32_t(tids.size())).second) tids.push_back(s.tid);
    std::string p;
    p.reserve(samples.size() * 5 + tids.size() * 4 + 32);
    put_varint(p, uint64_t(1000000000 / (hz > 0 ? hz : 100)));
    put_varint(p, samples.size());
    put_varint(p, tids.size());
    for (uint64_t t : tids) put_varint(p, t);
    int64_t prev = converter().to_ns(samples[0].tick);
    put_varint(p, zigzag(prev));
    for (const Sample& s : samples) {
      const int64_t ns = converter().to_ns(s.tick);
      put_varint(p, zigzag(ns - prev));
      prev = ns;
      put_varint(p, index[s.tid]);
      put_varint(p, s.stack);
    }
    append_chunk(out, kChunkPySamples, p);
  }
  std::lock_guard<std::mutex> dl(g_p.data_mu);
  g_p.bytes += out.size() - before;
}

}  // namespace stepscope
