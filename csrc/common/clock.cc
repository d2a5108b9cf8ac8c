#include "common/clock.h"

#include <fstream>
#include <string>

namespace stepscope {

bool g_use_tsc = false;
static bool g_monotonic_forced = false;  // STEPSCOPE_CLOCK=monotonic, from the settings (core/config.py)

void force_monotonic(bool forced) { g_monotonic_forced = forced; }
bool monotonic_forced() { return g_monotonic_forced; }

static bool tsc_trusted() {
#ifdef STEPSCOPE_HAVE_TSC
  if (g_monotonic_forced) return false;
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) == 0) {
      return line.find(" constant_tsc") != std::string::npos &&
             line.find(" nonstop_tsc") != std::string::npos;
    }
  }
#endif
  return false;
}

Anchor TickConverter::take() {
  // The ns read lies between two tick reads; keep the tightest of a few tries.
  Anchor best{0, 0};
  uint64_t best_width = UINT64_MAX;
  for (int i = 0; i < 5; ++i) {
    uint64_t a = ticks();
    int64_t ns = mono_ns();
    uint64_t b = ticks();
    if (b - a < best_width) {
      best_width = b - a;
      best = {a + (b - a) / 2, ns};
    }
  }
  return best;
}

void TickConverter::init() {
  g_use_tsc = tsc_trusted();
  anchors_.clear();
  last_ = 0;
  anchors_.push_back(take());
  if (g_use_tsc) {
    // A first slope from a 2 ms window; every flush adds an anchor after that.
    int64_t until = mono_ns() + 2000000;
    while (mono_ns() < until) {
    }
    anchors_.push_back(take());
  }
}

void TickConverter::add_anchor() {
  Anchor a = take();
  if (a.ticks > anchors_.back().ticks && a.ns > anchors_.back().ns) anchors_.push_back(a);
}

double TickConverter::ticks_per_ns() const {
  if (!g_use_tsc || anchors_.size() < 2) return 1.0;
  const Anchor& a = anchors_.front();
  const Anchor& b = anchors_.back();
  return double(b.ticks - a.ticks) / double(b.ns - a.ns);
}

int64_t TickConverter::to_ns(uint64_t t) const {
  if (!g_use_tsc) return int64_t(t);
  const size_t n = anchors_.size();
  // Find segment i such that anchors_[i].ticks <= t < anchors_[i+1].ticks,
  // extrapolating with the first/last segment outside the anchors.
  size_t i = last_;
  if (!(anchors_[i].ticks <= t && (i + 1 >= n || t < anchors_[i + 1].ticks))) {
    size_t lo = 0, hi = n - 1;
    while (lo < hi) {
      size_t mid = (lo + hi + 1) / 2;
      if (anchors_[mid].ticks <= t) lo = mid; else hi = mid - 1;
    }
    i = lo;
    last_ = i;
  }
  if (i + 1 >= n) i = n - 2;
  const Anchor& a = anchors_[i];
  const Anchor& b = anchors_[i + 1];
  const double slope = double(b.ns - a.ns) / double(b.ticks - a.ticks);
  const double dt = t >= a.ticks ? double(t - a.ticks) : -double(a.ticks - t);
  return a.ns + int64_t(dt * slope + (dt >= 0 ? 0.5 : -0.5));
}

}  // namespace stepscope
