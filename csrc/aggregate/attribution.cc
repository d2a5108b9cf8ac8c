// Innermost phase segments and time lookups (attribution.h), following gpu.py's
// ``_innermost_segments``/``_walk`` and ``_lookup`` step by step.
#include "aggregate/attribution.h"

#include <algorithm>
#include <numeric>

namespace stepscope {
namespace aggregate {

Segments innermost_segments(const int64_t* start, const int64_t* end, size_t n) {
  // by start, longer first, then as given (gpu.py's lexsort)
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (start[a] != start[b]) return start[a] < start[b];
    return end[a] > end[b];  // (equal starts: start - end ascending, without its overflow)
  });
  // One walk over every span: a span that overlaps nothing before it closes what
  // was open and starts afresh, as the reference's separate groups do.
  Segments out;
  out.start.reserve(n), out.end.reserve(n), out.span.reserve(n);
  std::vector<size_t> stack;  // open spans (positions in order), outermost first
  int64_t cursor = n ? start[order[0]] : 0;
  auto emit = [&](int64_t upto) {
    if (!stack.empty() && upto > cursor) {
      out.start.push_back(cursor);
      out.end.push_back(upto);
      out.span.push_back(int64_t(order[stack.back()]));
    }
    cursor = std::max(cursor, upto);
  };
  for (size_t i = 0; i < n; ++i) {
    const int64_t s = start[order[i]];
    while (!stack.empty() && end[order[stack.back()]] <= s) {
      emit(end[order[stack.back()]]);
      stack.pop_back();
    }
    emit(s);
    cursor = s;
    stack.push_back(i);
  }
  while (!stack.empty()) {
    emit(end[order[stack.back()]]);
    stack.pop_back();
  }
  return out;
}

void lookup(const Intervals& in, const int64_t* times, size_t n, int64_t* out) {
  size_t at = 0;  // the number of starts <= the last time looked up (a hint)
  for (size_t i = 0; i < n; ++i) {
    const int64_t t = times[i];
    if (t < 0 || in.n == 0) {
      out[i] = -1;
      continue;
    }
    // the number of starts <= t: gallop from the hint towards t, then bisect
    size_t lo, hi;
    if (at < in.n && in.start[at] <= t) {  // forwards
      size_t step = 1;
      lo = at + 1, hi = at + 1;
      while (hi < in.n && in.start[hi] <= t) lo = hi + 1, hi = std::min(in.n, hi + step), step *= 2;
      if (hi < lo) hi = lo;
    } else {  // backwards
      size_t step = 1;
      hi = at, lo = at;
      while (lo > 0 && in.start[lo - 1] > t) hi = lo - 1, lo = lo > step ? lo - step : 0, step *= 2;
    }
    at = size_t(std::upper_bound(in.start + lo, in.start + hi, t) - in.start);
    out[i] = at > 0 && t < in.end[at - 1] ? int64_t(at - 1) : -1;
  }
}

}  // namespace aggregate
}  // namespace stepscope
