// Python frames read without the GIL, from the sampler's native thread.
//
// The thread running Python keeps running while we read: its frames are
// pushed, popped and freed under our feet, and a thread state can be freed
// while we follow the list. So nothing here dereferences interpreter memory:
// every struct is copied with process_vm_readv on our own pid, which returns
// EFAULT for an unmapped address instead of a SIGSEGV (the method of py-spy,
// Austin and echion). What a copy can still give is stale or torn data; it is
// bounded (threads, depth, string and table sizes) and checked where it
// matters (a code object's type, the instruction inside its code), and the
// caller validates code objects by their identifying fields (Code::identity).
//
// The layouts come from CPython's own internal headers (Py_BUILD_CORE only
// around them), for the version this extension is compiled for: 3.11, 3.12
// and 3.13 with a GIL (the three differ in where the current frame is and what
// a frame says about its code and instruction: SS_CODE_OF, SS_INSTR_OF,
// current_frame() below; their location tables are the same). Other versions,
// and free-threaded builds, compile this out and sample with the GIL
// (pysampler.cc).
#include <Python.h>

#include "record/pyframes.h"

#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <algorithm>
#include <cstring>

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000 && !defined(Py_GIL_DISABLED)
#define SS_READ_FRAMES 1
// pycore_frame.h (and the pycore_code.h etc. it pulls in) compile as C++ in
// 3.11-3.13; 3.13's refuse to compile without Py_BUILD_CORE. Only the structs'
// layouts are used: no inline function of theirs runs here.
#define Py_BUILD_CORE 1
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE
#if PY_VERSION_HEX >= 0x030D0000
// 3.13: f_executable, a strong reference to the code object (None in the C
// stack's entry frames); instr_ptr, the instruction being run or about to
// begin, which is what _PyInterpreterFrame_LASTI and so PyFrame_GetLineNumber
// measure from (no "previous instruction" any more).
#define SS_CODE_OF(fr) (fr).f_executable
#define SS_INSTR_OF(fr) (fr).instr_ptr
#else
// 3.11, 3.12: f_code; prev_instr, the code unit before the next instruction
// (_PyInterpreterFrame_LASTI measures from it; -1 in a frame not started yet).
#define SS_CODE_OF(fr) (fr).f_code
#define SS_INSTR_OF(fr) (fr).prev_instr
#endif
#else
#define SS_READ_FRAMES 0
#endif

namespace stepscope {
namespace pyframes {
namespace {

constexpr int kMaxThreads = 4096;          // thread states walked a pass (a cycle in torn data ends too)
constexpr size_t kMaxName = 4096;          // characters of a function or file name
constexpr size_t kMaxLineTable = 1 << 16;  // bytes; a larger table gives every frame its first line
constexpr size_t kMaxIov = 512;            // code objects checked a vectored read (IOV_MAX is 1024)

std::atomic<pid_t> g_pid{0};  // this process's (set again after a fork)

// Copies n bytes at addr; false where any of it is not mapped (or addr is null).
bool copy(uintptr_t addr, void* out, size_t n) {
  if (addr == 0 || n == 0) return false;
  iovec local{out, n};
  iovec remote{reinterpret_cast<void*>(addr), n};
  return process_vm_readv(g_pid.load(std::memory_order_relaxed), &local, 1, &remote, 1, 0) == ssize_t(n);
}

template <typename T>
bool copy(const T* addr, T* out) {
  return copy(reinterpret_cast<uintptr_t>(addr), out, sizeof(T));
}

void put_utf8(std::string& s, uint32_t c) {
  if (c > 0x10FFFF) c = '?';  // not a code point (a torn copy): the text stays UTF-8
  if (c < 0x80) {
    s += char(c);
  } else if (c < 0x800) {
    s += char(0xC0 | (c >> 6));
    s += char(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    if (c >= 0xD800 && c <= 0xDFFF) c = '?';  // a lone surrogate: not UTF-8
    s += char(0xE0 | (c >> 12));
    s += char(0x80 | ((c >> 6) & 0x3F));
    s += char(0x80 | (c & 0x3F));
  } else {
    s += char(0xF0 | (c >> 18));
    s += char(0x80 | ((c >> 12) & 0x3F));
    s += char(0x80 | ((c >> 6) & 0x3F));
    s += char(0x80 | (c & 0x3F));
  }
}

#if SS_READ_FRAMES
// Whether a copied reference count is a live object's. A freed object's memory
// can still hold its old fields (nothing reused it yet), and a code object's
// names may be gone and their memory holding other strings: but freeing writes
// over the first word, the count (pymalloc: the next free block's address, or
// 0; malloc's bins and tcache write over the type too), and a count is 0 while
// the object is being freed. Live counts are small; 3.12 and 3.13's immortal
// objects (interned names, static code) have 2^32-1 (_Py_IMMORTAL_REFCNT on 64-bit
// builds), a little more after old extensions' increments: under 2^40 too.
bool alive(Py_ssize_t refcnt) { return refcnt >= 1 && refcnt < (Py_ssize_t(1) << 40); }

// A str object's text as UTF-8 (compact strings: every name CPython makes).
bool read_str(uintptr_t addr, std::string* out) {
  PyCompactUnicodeObject u;
  if (!copy(addr, &u, sizeof(PyASCIIObject))) return false;
  const PyASCIIObject& a = u._base;
  if (a.ob_base.ob_type != &PyUnicode_Type || !alive(a.ob_base.ob_refcnt) || !a.state.compact || a.length < 0)
    return false;
  const size_t n = std::min(size_t(a.length), kMaxName);
  if (a.state.ascii) {  // (a string freed and reused under the read may not be: checked)
    out->resize(n);
    if (n && !copy(addr + sizeof(PyASCIIObject), &(*out)[0], n)) return false;
    for (char c : *out)
      if (static_cast<unsigned char>(c) >= 0x80) return false;
    return true;
  }
  const unsigned kind = a.state.kind;
  if (kind != 1 && kind != 2 && kind != 4) return false;
  std::vector<uint8_t> raw(n * kind);
  if (n && !copy(addr + sizeof(PyCompactUnicodeObject), raw.data(), raw.size())) return false;
  out->clear();
  for (size_t i = 0; i < n; ++i) {
    uint32_t c = 0;
    std::memcpy(&c, &raw[i * kind], kind);  // little-endian: the low bytes hold the code point
    put_utf8(*out, c);
  }
  return true;
}

bool read_bytes(uintptr_t addr, std::vector<uint8_t>* out) {
  PyBytesObject b;
  if (!copy(addr, &b, offsetof(PyBytesObject, ob_sval))) return false;
  if (b.ob_base.ob_base.ob_type != &PyBytes_Type || b.ob_base.ob_size < 0 ||
      size_t(b.ob_base.ob_size) > kMaxLineTable)
    return false;
  out->resize(size_t(b.ob_base.ob_size));
  return out->empty() || copy(addr + offsetof(PyBytesObject, ob_sval), out->data(), out->size());
}

// The location table of 3.11-3.13 (Objects/locations.md, unchanged in 3.12, 3.13): entries of a first byte
// (1, 4 bits of kind, 3 bits of length - 1 in code units) and varints.
int varint(const std::vector<uint8_t>& t, size_t* i) {
  unsigned v = 0, shift = 0;
  while (*i < t.size()) {
    const unsigned b = t[(*i)++];
    v |= (b & 63u) << shift;
    shift += 6;
    if (!(b & 64) || shift > 30) break;
  }
  return int(v);
}

int signed_varint(const std::vector<uint8_t>& t, size_t* i) {
  const unsigned v = unsigned(varint(t, i));
  return (v & 1) ? -int(v >> 1) : int(v >> 1);
}
#endif

}  // namespace

bool compiled_in() { return SS_READ_FRAMES != 0; }

bool usable() {
  g_pid.store(getpid(), std::memory_order_relaxed);
  volatile uint64_t probe = 0x5eed;
  uint64_t got = 0;
  return copy(reinterpret_cast<uintptr_t>(&probe), &got, sizeof(got)) && got == 0x5eed;
}

#if SS_READ_FRAMES

namespace {

// The thread's innermost frame (null: none, or its copy failed).
const _PyInterpreterFrame* current_frame(const PyThreadState& t) {
#if PY_VERSION_HEX >= 0x030D0000
  return t.current_frame;  // 3.13 has no _PyCFrame
#else
  _PyCFrame cf;
  return t.cframe && copy(t.cframe, &cf) ? cf.current_frame : nullptr;
#endif
}

// The frames of the thread state t (copied from `state`), appended to frames.
bool frames_of(const PyThreadState& t, uintptr_t state, int max_depth, uint64_t when, RawThread* out,
               std::vector<RawFrame>& frames) {
  const _PyInterpreterFrame* f = current_frame(t);
  if (!f) return false;
  *out = RawThread{t.thread_id, uint64_t(t.native_thread_id), uint32_t(frames.size()), 0, when, true, state};
  [[maybe_unused]] const _PyInterpreterFrame* last = nullptr;  // the last frame copied (3.11's check)
  [[maybe_unused]] bool last_generator = false;
  bool torn = false;
  // Bounded by copies, not by frames kept: a chain of skipped shims ends too.
  for (int copies = 0; f && copies < 2 * max_depth && int(frames.size() - out->first) < max_depth; ++copies) {
    _PyInterpreterFrame fr;
    if (!copy(reinterpret_cast<uintptr_t>(f), &fr, offsetof(_PyInterpreterFrame, localsplus))) {
      torn = true;  // a frame freed under the read (its data-stack chunk unmapped)
      break;
    }
    last = f;
    last_generator = fr.owner == FRAME_OWNED_BY_GENERATOR;
    f = fr.previous;
#if PY_VERSION_HEX >= 0x030C0000
    // 3.12+: each call into the interpreter from C pushes an entry frame owned by
    // the C stack (a trampoline code object in 3.12, None in 3.13), which
    // CPython's walkers skip too; and every thread's chain ends at one (its first
    // call's), with no previous. A chain that ends elsewhere was torn: mostly a
    // generator that yielded between the copy of the thread state and that of its
    // frame (a yield clears the frame's previous); and the entry frame lives on
    // the C stack, where once its call returned the next C call writes: a copy of
    // it then is garbage (an owner that is none, or a code that is no code).
    if (fr.owner == FRAME_OWNED_BY_CSTACK) continue;
    if (fr.owner < FRAME_OWNED_BY_THREAD || fr.owner > FRAME_OWNED_BY_CSTACK || !f) {
      torn = true;
      break;
    }
#endif
    const uintptr_t code = reinterpret_cast<uintptr_t>(SS_CODE_OF(fr));
    // (read_stack checks it is a code object: a frame whose code is none makes the read torn)
    const intptr_t units = (reinterpret_cast<intptr_t>(SS_INSTR_OF(fr)) -
                            intptr_t(code + offsetof(PyCodeObject, co_code_adaptive))) /
                           intptr_t(sizeof(_Py_CODEUNIT));
    const int32_t lasti = units < -1 || units > INT32_MAX ? INT32_MIN : int32_t(units);
    frames.push_back({code, lasti, fr.owner == FRAME_OWNED_BY_GENERATOR});
  }
#if PY_VERSION_HEX < 0x030C0000
  // 3.11: a chain ending at a generator's frame is mostly one that yielded between
  // the copy of the thread state and that of the frame (a yield clears its
  // previous; on the development VM a pure-Python generator's caller lost 4% of
  // its samples to one-frame stacks so). It is the thread's first frame only where
  // C runs a generator first (a thread started on a generator's __next__): then
  // the generator is running. Its state and its frame (which the generator object
  // holds right after it) in one copy of a few dozen bytes tell the two apart: a
  // second copy of each, microseconds apart, let a generator yielding every few
  // hundred nanoseconds pass as running.
  if (!f && last_generator) {
    constexpr size_t at = offsetof(PyGenObject, gi_frame_state), to = offsetof(PyGenObject, gi_iframe);
    alignas(8) unsigned char raw[to - at + offsetof(_PyInterpreterFrame, localsplus)];
    _PyInterpreterFrame g;
    torn = !copy(reinterpret_cast<uintptr_t>(last) - (to - at), raw, sizeof raw);
    std::memcpy(&g, raw + (to - at), offsetof(_PyInterpreterFrame, localsplus));
    torn = torn || int8_t(raw[0]) != FRAME_EXECUTING || g.previous != nullptr;
  }
#endif
  if (torn) frames.push_back({0, INT32_MIN, false});  // read_stack: no code object there, a torn read
  out->count = uint32_t(frames.size() - out->first);
  if (out->count == 0) return false;
  return true;
}

}  // namespace

void read_threads(const void* interp, int max_depth, uint64_t (*now)(), WantFrames want,
                  std::vector<RawThread>& threads, std::vector<RawFrame>& frames) {
  // A plain load of the list's head: the interpreter outlives the sampler.
  PyThreadState* ts = PyInterpreterState_ThreadHead(const_cast<PyInterpreterState*>(
      static_cast<const PyInterpreterState*>(interp)));
  for (int n = 0; ts && n < kMaxThreads; ++n) {
    PyThreadState t;
    const uintptr_t state = reinterpret_cast<uintptr_t>(ts);
    const uint64_t when = now();  // before the thread state: what the copy shows is from then on
    if (!copy(ts, &t)) break;
    ts = t.next;
    RawThread rt{t.thread_id, uint64_t(t.native_thread_id), uint32_t(frames.size()), 0, when, false, state};
    if (!want(t.thread_id, uint64_t(t.native_thread_id)) || frames_of(t, state, max_depth, when, &rt, frames)) {
      rt.read_ticks = now() - when;
      threads.push_back(rt);
    }
  }
}

bool read_thread_again(const RawThread& was, int max_depth, uint64_t (*now)(), RawThread* out,
                       std::vector<RawFrame>& frames) {
  PyThreadState t;
  const uint64_t when = now();
  if (!copy(reinterpret_cast<const PyThreadState*>(was.state), &t) || t.thread_id != was.ident ||
      uint64_t(t.native_thread_id) != was.tid || !frames_of(t, was.state, max_depth, when, out, frames))
    return false;
  out->read_ticks = now() - when;
  return true;
}

bool identity_of(const PyCodeObject& c, Code* out);

bool read_identity(uintptr_t addr, Code* out) {
  PyCodeObject c;
  return copy(addr, &c, offsetof(PyCodeObject, co_code_adaptive)) && identity_of(c, out);
}

void read_identities(const uintptr_t* addrs, size_t n, Code* out, bool* ok) {
  constexpr size_t kHeader = offsetof(PyCodeObject, co_code_adaptive);
  static std::vector<PyCodeObject> got;
  static std::vector<iovec> local, remote;
  for (size_t i0 = 0; i0 < n;) {
    const size_t m = std::min(n - i0, kMaxIov);
    got.resize(m);
    local.resize(m);
    remote.resize(m);
    for (size_t j = 0; j < m; ++j) {
      local[j] = {&got[j], kHeader};
      remote[j] = {reinterpret_cast<void*>(addrs[i0 + j]), kHeader};
    }
    // A vectored read stops at the first address that faults: those before it
    // were copied whole, that one is not a code object, the rest are read next.
    const ssize_t r = process_vm_readv(g_pid.load(std::memory_order_relaxed), local.data(), m, remote.data(), m, 0);
    const size_t whole = r > 0 ? size_t(r) / kHeader : 0;
    for (size_t j = 0; j < whole; ++j) ok[i0 + j] = identity_of(got[j], &out[i0 + j]);
    if (whole < m) ok[i0 + whole] = false;
    i0 += std::min(m, whole + 1);
  }
}

bool identity_of(const PyCodeObject& c, Code* out) {
  if (c.ob_base.ob_base.ob_type != &PyCode_Type || c.ob_base.ob_size <= 0 || !alive(c.ob_base.ob_base.ob_refcnt))
    return false;
  // Fields set at creation and never changed: a code object made at a dead one's
  // address matches them all only if it is the same code (same names, same table).
  const PyObject* ids[] = {c.co_consts, c.co_names, c.co_exceptiontable, c.co_localsplusnames,
                           c.co_localspluskinds, c.co_filename, c.co_name, c.co_qualname, c.co_linetable};
  for (int i = 0; i < 9; ++i) out->identity[i] = reinterpret_cast<uintptr_t>(ids[i]);
  out->identity[9] = (uintptr_t(uint32_t(c.co_flags)) << 32) | uint32_t(c.co_nlocalsplus);
  out->size = int32_t(c.ob_base.ob_size);
  out->first_traceable = c._co_firsttraceable;
  out->first_line = c.co_firstlineno;
  return true;
}

bool read_names(uintptr_t addr, Code* out) {
  if (!read_identity(addr, out)) return false;
  // A live code object's names are compact strings it keeps alive: one that does
  // not read is a code object freed under the read (its memory not reused yet).
  if (!read_str(out->identity[7], &out->qualname) || !read_str(out->identity[5], &out->filename)) return false;
  if (!read_bytes(out->identity[8], &out->line_table)) out->line_table.clear();
  // The same identity after the copies: they were copied from the same code object.
  Code again;
  return read_identity(addr, &again) && same_identity(*out, again);
}

int line_at(const Code& code, int lasti) {
  if (lasti < 0 || code.line_table.empty()) return code.first_line;
  const std::vector<uint8_t>& t = code.line_table;
  int line = code.first_line, end = 0;
  size_t i = 0;
  while (i < t.size()) {
    const uint8_t head = t[i++];
    const int kind = (head >> 3) & 15;
    int delta = 0;
    if (kind == 13 || kind == 14) {  // no columns; long form
      const size_t at = i;
      delta = signed_varint(t, &i);
      i = at;
    } else if (kind >= 10 && kind <= 12) {  // one line, 0-2 lines down
      delta = kind - 10;
    }
    line += delta;
    end += (head & 7) + 1;
    while (i < t.size() && !(t[i] & 128)) ++i;  // the entry's other bytes
    if (lasti < end) return kind == 15 ? -1 : line;
  }
  return -1;
}

#else

void read_threads(const void*, int, uint64_t (*)(), WantFrames, std::vector<RawThread>&, std::vector<RawFrame>&) {}
bool read_thread_again(const RawThread&, int, uint64_t (*)(), RawThread*, std::vector<RawFrame>&) { return false; }
bool read_identity(uintptr_t, Code*) { return false; }
void read_identities(const uintptr_t*, size_t n, Code*, bool* ok) {
  for (size_t i = 0; i < n; ++i) ok[i] = false;
}
bool read_names(uintptr_t, Code*) { return false; }
int line_at(const Code& code, int) { return code.first_line; }

#endif

}  // namespace pyframes
}  // namespace stepscope
