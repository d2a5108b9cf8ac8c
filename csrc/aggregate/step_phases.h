// The steps and phases tables of one process, from its decoded events: the step
// rows from the step marks, each phase span attributed to its step with its
// exclusive time, and per step the five phases' exclusive sums and Other.
//
// This is the analysis's hottest per-record work (a long run holds millions of
// phases). Its definition is analysis/tables/stepping.py, whose Python stays the
// reference: tests/test_step_phases_native.py compares the two on every corpus
// run and on edge cases (nesting, several loop threads, interrupted steps, the
// profiler's own windows inside phases).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace stepscope {
namespace aggregate {

constexpr int kPhases = 5;  // GetNext, Forward, Loss, Backward, Optimizer (PHASES' order)

// One process's events in start order (parents before children), as columns.
struct EventColumns {
  size_t n = 0;
  const int8_t* kind = nullptr;      // codes of EVENT_KINDS
  const int8_t* category = nullptr;  // codes of CATEGORIES
  const int32_t* name = nullptr;     // name codes, < names
  const int64_t* tid = nullptr;
  const int64_t* start = nullptr;
  const int64_t* end = nullptr;
  const int64_t* arg = nullptr;
};

// The codes the pass compares against; -1 where the run has no such name.
struct Codes {
  int kind_instant = -1, kind_span = -1;
  int cat_step = -1, cat_phase = -1, cat_framework = -1;
  int32_t end_mark = -1, interrupted = -1;
  int32_t names = 0;
  const int8_t* phase_of_name = nullptr;     // per name code: index in PHASES, or -1 (not counted)
  const uint8_t* op_window_name = nullptr;   // per name code: 1 for the profiler's own window spans
};

struct StepPhases {
  // steps, in table order
  std::vector<int64_t> step_row;  // the mark's event row
  std::vector<int64_t> step_tid, step_start, step_end;
  std::vector<uint8_t> step_interrupted;
  size_t interrupt_marks = 0;  // interrupted marks seen (matched or not)
  std::vector<int64_t> phase_sum[kPhases];
  std::vector<int64_t> other;
  // phases, in event order
  std::vector<int64_t> phase_row;    // the span's event row
  std::vector<int64_t> phase_step;   // index into the steps above, or -1
  std::vector<int64_t> phase_exclusive;
};

StepPhases step_phases(const EventColumns& e, const Codes& c);

}  // namespace aggregate
}  // namespace stepscope
