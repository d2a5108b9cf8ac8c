// Reading every thread's Python frames without the GIL (pyframes.cc): the
// Python sampler's way to sample at times of its own choosing (issue 45).
// Every read of interpreter memory is a copy that fails (EFAULT) instead of
// faulting where the memory is gone: a frame torn down mid-read gives a wrong
// or dropped sample, never a crash.
#pragma once
#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace stepscope {
namespace pyframes {

// Whether this build knows its Python's frame layout (CPython 3.11-3.13 with a
// GIL; other versions use the GIL-holding sampler).
bool compiled_in();
// Whether this process may copy its own memory (process_vm_readv: a seccomp
// profile may forbid it). Also takes the process id the copies use: call it
// in each process (after a fork) before read_threads.
bool usable();

struct RawFrame {
  uintptr_t code;     // the code object's address, unvalidated
  int32_t lasti;      // _PyInterpreterFrame_LASTI, in code units: the last instruction
                      // started (3.11, 3.12; -1: none yet), the one running (3.13)
  bool generator;     // owned by a generator or coroutine (never incomplete)
};
struct RawThread {
  unsigned long ident;  // threading.get_ident()
  uint64_t tid;         // the OS thread id
  uint32_t first, count;  // its frames in the frames vector, innermost first
  uint64_t when;          // now() before its thread state was copied: what the frames show is from then on
  bool copied;            // false: want() said the caller knows its frames (count is 0)
  uintptr_t state;        // its thread state's address
  uint64_t read_ticks = 0;  // how long the copy took, from the thread state's: a read
                            // the sampler was descheduled in shows frames of two moments
};
// Whether to copy a thread's frames (the caller may know them: a thread that has
// not run since it last read them) or to leave them (stepscope's own threads).
using WantFrames = bool (*)(unsigned long ident, uint64_t tid);

// Every thread state of the interpreter with a frame: appended to threads and
// frames (innermost first, at most max_depth a thread). Bounded in threads.
// Threads want() declines are appended without frames (copied false).
void read_threads(const void* interp, int max_depth, uint64_t (*now)(), WantFrames want,
                  std::vector<RawThread>& threads, std::vector<RawFrame>& frames);

// A code object as copied: the fields that identify it (a dead code object's
// address reused by another gives another identity), and what names it.
struct Code {
  uintptr_t identity[10] = {};
  int32_t size = 0;              // code units
  int32_t first_traceable = 0;   // frames before it are still being set up
  int32_t first_line = 0;
  std::string qualname, filename;
  std::vector<uint8_t> line_table;
};
// The thread's frames copied again (after a torn read): false where its thread
// state is gone or is another thread's now.
bool read_thread_again(const RawThread& was, int max_depth, uint64_t (*now)(), RawThread* out,
                       std::vector<RawFrame>& frames);

// The identifying fields of the code object at addr; false when it is not one.
bool read_identity(uintptr_t addr, Code* out);
// The identities of n code objects in one vectored copy: ok[i] false where
// addrs[i] is not one (out[i] then undefined).
void read_identities(const uintptr_t* addrs, size_t n, Code* out, bool* ok);
// The names and line table too (once per new code object).
bool read_names(uintptr_t addr, Code* out);
inline bool same_identity(const Code& a, const Code& b) {
  for (int i = 0; i < 10; ++i)
    if (a.identity[i] != b.identity[i]) return false;
  return a.size == b.size && a.first_line == b.first_line;
}
// The line of instruction lasti (code units) from the copied line table, as
// PyCode_Addr2Line gives it: -1 where the instruction has no line.
int line_at(const Code& code, int lasti);

}  // namespace pyframes
}  // namespace stepscope
