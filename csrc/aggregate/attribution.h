// GPU records to the step and the innermost phase of their process running at a
// host time (their launch call's start; a sync's own start).
//
// Definition: analysis/tables/gpu.py (``_innermost_segments``, ``_lookup``), whose
// Python stays the reference: tests/test_attribution_native.py compares the two on
// random spans (nesting, ties, empty spans) and on the corpus's GPU fixtures.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace stepscope {
namespace aggregate {

// Phase spans (of one process) as non-overlapping segments, each naming the
// innermost span covering it, in time order.
struct Segments {
  std::vector<int64_t> start, end;
  std::vector<int64_t> span;  // index of the span among those given
};

Segments innermost_segments(const int64_t* start, const int64_t* end, size_t n);

// Intervals sorted by start; ``value`` of the last interval that starts at or
// before a time and ends after it, else -1.
struct Intervals {
  const int64_t* start = nullptr;
  const int64_t* end = nullptr;
  size_t n = 0;
};

// For each time: the row of ``in`` it falls in (as ``_lookup``: the last start at or
// before it, if that interval has not ended), -1 when none; times < 0 find none.
// Times mostly increase (records in start order): each search starts from the last.
void lookup(const Intervals& in, const int64_t* times, size_t n, int64_t* out);

}  // namespace aggregate
}  // namespace stepscope
