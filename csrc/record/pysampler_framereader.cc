// The Python sampler's frame reader: every thread's frames copied without the GIL
// (pyframes.cc), checked and interned; new threads' names looked up with it, rate-limited.
#include <Python.h>
#if PY_VERSION_HEX < 0x030B0000
#include <frameobject.h>  // PyFrame_GetBack: Python.h declares it only from 3.11
#endif

#include <time.h>

#include <algorithm>
#include <memory>

#include "record/pysampler_tables.h"
#include "record/recorder.h"

namespace stepscope {
namespace pysampler {
namespace {

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

}  // namespace

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

namespace {

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

}  // namespace

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

}  // namespace pysampler
}  // namespace stepscope
