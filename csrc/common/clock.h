// Clock: events carry raw "ticks" (the TSC where it can be trusted, else
// CLOCK_MONOTONIC nanoseconds). The writer converts ticks to CLOCK_MONOTONIC
// nanoseconds with a piecewise-linear map between (ticks, ns) anchors taken
// once per flush, so a tick value always maps to the same nanosecond and the
// map follows NTP slewing of CLOCK_MONOTONIC. Files store nanoseconds only.
#pragma once
#include <cstdint>
#include <ctime>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#define STEPSCOPE_HAVE_TSC 1
#endif

namespace stepscope {

inline int64_t mono_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

inline int64_t real_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

extern bool g_use_tsc;
// STEPSCOPE_CLOCK=monotonic: the next TickConverter::init() takes CLOCK_MONOTONIC, trusted TSC or not.
void force_monotonic(bool forced);
bool monotonic_forced();

inline uint64_t ticks() {
#ifdef STEPSCOPE_HAVE_TSC
  if (__builtin_expect(g_use_tsc, 1)) return __rdtsc();
#endif
  return uint64_t(mono_ns());
}

struct Anchor {
  uint64_t ticks;
  int64_t ns;
};

class TickConverter {
 public:
  // Decides the tick source (TSC only with constant_tsc and nonstop_tsc;
  // STEPSCOPE_CLOCK=monotonic forces the fallback) and takes the first anchors.
  void init();
  // A fresh (ticks, ns) pair, bracketed by two tick reads to bound its error.
  void add_anchor();
  int64_t to_ns(uint64_t t) const;
  const char* source() const { return g_use_tsc ? "tsc" : "monotonic"; }
  double ticks_per_ns() const;

 private:
  static Anchor take();
  std::vector<Anchor> anchors_;
  mutable size_t last_ = 0;  // segment cache: most ticks are recent
};

}  // namespace stepscope
