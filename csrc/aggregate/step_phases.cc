// The steps and phases of one process in one pass over its events (step_phases.h).
// Each function mirrors the stepping.py function of the same role, named in its
// comment; where Python's order of operations decides a result (stable sorts,
// the first of equal maxima, cuts taken from one snapshot), this follows it.
#include "aggregate/step_phases.h"

#include <algorithm>
#include <numeric>
#include <tuple>

namespace stepscope {
namespace aggregate {
namespace {

bool is(const EventColumns& e, size_t i, int cat, int kind) {
  return cat >= 0 && kind >= 0 && e.category[i] == cat && e.kind[i] == kind;
}

bool named(const EventColumns& e, size_t i, int32_t code) {  // (-1: the run has no such name)
  return code >= 0 && e.name[i] == code;
}

int phase_of(const Codes& c, int32_t name) {  // PHASES index, or -1: not one of the five
  return name >= 0 && name < c.names ? c.phase_of_name[name] : -1;
}

// _bare_steps and _flag_interrupted: the step rows.
void find_steps(const EventColumns& e, const Codes& c, StepPhases& out) {
  std::vector<size_t> marks, flags;
  int64_t last_end = INT64_MIN;
  for (size_t i = 0; i < e.n; ++i) {
    last_end = std::max(last_end, e.end[i]);
    if (!is(e, i, c.cat_step, c.kind_instant)) continue;
    (named(e, i, c.interrupted) ? flags : marks).push_back(i);
  }
  auto thread = [&](size_t i) {
    return named(e, i, c.end_mark) && e.arg[i] > 0 ? e.arg[i] : e.tid[i];
  };
  // by thread, then start; stable (the event order breaks ties)
  std::stable_sort(marks.begin(), marks.end(), [&](size_t a, size_t b) {
    int64_t ta = thread(a), tb = thread(b);
    return ta != tb ? ta < tb : e.start[a] < e.start[b];
  });
  std::vector<size_t> kept;
  std::vector<int64_t> ends;
  for (size_t k = 0; k < marks.size(); ++k) {
    size_t i = marks[k];
    bool last = k + 1 == marks.size() || thread(marks[k + 1]) != thread(i);
    if (named(e, i, c.end_mark)) continue;  // an end mark only ends the step before it
    kept.push_back(i);
    ends.push_back(last ? last_end : e.start[marks[k + 1]]);
  }
  std::vector<size_t> order(kept.size());
  std::iota(order.begin(), order.end(), 0);
  bool threads = false;
  for (size_t k = 1; k < kept.size() && !threads; ++k) threads = thread(kept[k]) != thread(kept[0]);
  if (threads)  // steps of several loop threads: in start order
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return e.start[kept[a]] < e.start[kept[b]]; });
  for (size_t k : order) {
    size_t i = kept[k];
    out.step_row.push_back(int64_t(i));
    out.step_tid.push_back(thread(i));
    out.step_start.push_back(e.start[i]);
    out.step_end.push_back(ends[k]);
  }
  out.step_interrupted.assign(out.step_row.size(), 0);
  out.interrupt_marks = flags.size();
  if (flags.empty()) return;
  // per mark, the latest step of its thread with its number begun by then (the first in
  // table order of equals): steps by (thread, number, start), a binary search each
  std::vector<size_t> by(out.step_row.size());
  std::iota(by.begin(), by.end(), 0);
  auto key = [&](size_t s) { return std::make_tuple(out.step_tid[s], e.arg[size_t(out.step_row[s])], out.step_start[s]); };
  std::stable_sort(by.begin(), by.end(), [&](size_t a, size_t b) { return key(a) < key(b); });
  for (size_t f : flags) {
    auto mark = std::make_tuple(e.tid[f], e.arg[f], e.start[f]);
    auto it = std::upper_bound(by.begin(), by.end(), mark, [&](const auto& m, size_t s) { return m < key(s); });
    if (it == by.begin()) continue;
    size_t s = *--it;
    if (out.step_tid[s] != e.tid[f] || e.arg[size_t(out.step_row[s])] != e.arg[f]) continue;  // none begun by then
    while (it != by.begin() && key(*(it - 1)) == key(s)) s = *--it;  // equal starts: the first in table order
    out.step_interrupted[s] = 1;
  }
}

// _attribute_among: the step (of `among`, indices into the steps) whose [start, end) holds each start.
void attribute_among(const StepPhases& s, std::vector<size_t> among, const EventColumns& e, const std::vector<size_t>& rows,
                     std::vector<int64_t>& label) {
  std::stable_sort(among.begin(), among.end(), [&](size_t a, size_t b) { return s.step_start[a] < s.step_start[b]; });
  std::vector<int64_t> starts(among.size());
  for (size_t k = 0; k < among.size(); ++k) starts[k] = s.step_start[among[k]];
  size_t next = 0;  // the first step starting after the start before (spans come in start order)
  int64_t before = INT64_MIN;
  for (size_t j = 0; j < rows.size(); ++j) {
    int64_t at = e.start[rows[j]];
    if (at < before) next = size_t(std::upper_bound(starts.begin(), starts.end(), at) - starts.begin());
    while (next < starts.size() && starts[next] <= at) ++next;  // a step or two on: a walk, not a search
    before = at;
    if (next == 0) {
      label[j] = -1;
      continue;
    }
    size_t step = among[next - 1];
    label[j] = at >= s.step_end[step] ? -1 : int64_t(step);
  }
}

// attribute_to_steps: by time; where loops ran on several threads, a span on one of
// those threads belongs to that thread's steps.
void attribute(StepPhases& s, const EventColumns& e, const std::vector<size_t>& rows) {
  std::vector<int64_t>& label = s.phase_step;
  label.assign(rows.size(), -1);
  if (s.step_row.empty()) return;
  std::vector<size_t> all(s.step_row.size());
  std::iota(all.begin(), all.end(), 0);
  attribute_among(s, all, e, rows, label);
  std::vector<int64_t> threads(s.step_tid);
  std::sort(threads.begin(), threads.end());
  threads.erase(std::unique(threads.begin(), threads.end()), threads.end());
  if (threads.size() < 2) return;
  for (int64_t t : threads) {
    std::vector<size_t> mine, on;
    for (size_t k : all)
      if (s.step_tid[k] == t) mine.push_back(k);
    std::vector<size_t> sub_rows;
    for (size_t j = 0; j < rows.size(); ++j)
      if (e.tid[rows[j]] == t) on.push_back(j), sub_rows.push_back(rows[j]);
    std::vector<int64_t> sub(on.size());
    attribute_among(s, mine, e, sub_rows, sub);
    for (size_t j = 0; j < on.size(); ++j) label[on[j]] = sub[j];
  }
}

// exclusive_durations: each span minus the spans nested in it on its thread
// (spans given by their positions `at` in rows; results into excl at those positions).
void exclusive(const EventColumns& e, const std::vector<size_t>& rows, const std::vector<size_t>& at,
               std::vector<int64_t>& excl) {
  auto S = [&](size_t k) { return e.start[rows[at[k]]]; };
  auto E = [&](size_t k) { return e.end[rows[at[k]]]; };
  auto T = [&](size_t k) { return e.tid[rows[at[k]]]; };
  bool simple = true;  // in order and nothing nests: the durations as they are
  for (size_t k = 1; k < at.size() && simple; ++k)
    if (T(k) == T(k - 1) && (S(k) < S(k - 1) || S(k) < E(k - 1))) simple = false;
  if (simple) return;
  // per thread, by start, the longer (the parent) first; stable. Events come in start
  // order with parents first, so one thread's spans need no sort (nor a copy of the
  // order): only several threads' do
  auto before = [&](size_t a, size_t b) {  // a sorts before b
    if (T(a) != T(b)) return T(a) < T(b);
    if (S(a) != S(b)) return S(a) < S(b);
    return S(a) - E(a) < S(b) - E(b);
  };
  bool ordered = true;
  for (size_t k = 1; k < at.size() && ordered; ++k) ordered = !before(k, k - 1);
  std::vector<size_t> order;
  if (!ordered) {
    struct Key {
      int64_t tid, start, minus_length;
      size_t k;
    };
    std::vector<Key> keys(at.size());
    for (size_t k = 0; k < at.size(); ++k) keys[k] = Key{T(k), S(k), S(k) - E(k), k};
    std::stable_sort(keys.begin(), keys.end(), [](const Key& a, const Key& b) {
      if (a.tid != b.tid) return a.tid < b.tid;
      if (a.start != b.start) return a.start < b.start;
      return a.minus_length < b.minus_length;
    });
    order.resize(at.size());
    for (size_t k = 0; k < at.size(); ++k) order[k] = keys[k].k;
  }
  std::vector<size_t> stack;
  for (size_t n = 0; n < at.size(); ++n) {
    size_t k = ordered ? n : order[n];
    while (!stack.empty() && (T(stack.back()) != T(k) || S(k) >= E(stack.back()))) stack.pop_back();
    if (!stack.empty()) {
      size_t parent = stack.back();
      excl[at[parent]] -= std::min(E(k), E(parent)) - S(k);
    }
    stack.push_back(k);
  }
}

// _take_out_profiler_work: the profiler's own windows leave the phase they fall in;
// returns the time taken out per step (empty: no window).
std::vector<int64_t> take_out_windows(StepPhases& s, const EventColumns& e, const Codes& c, const std::vector<size_t>& rows) {
  std::vector<size_t> windows;
  for (size_t i = 0; i < e.n; ++i)
    if (is(e, i, c.cat_framework, c.kind_span) && e.name[i] >= 0 && e.name[i] < c.names && c.op_window_name[e.name[i]])
      windows.push_back(i);
  if (windows.empty() || rows.empty()) return {};
  std::vector<int64_t> taken(s.step_row.size(), 0);
  std::vector<int64_t> tids;
  for (size_t w : windows) tids.push_back(e.tid[w]);
  std::sort(tids.begin(), tids.end());
  tids.erase(std::unique(tids.begin(), tids.end()), tids.end());
  for (int64_t t : tids) {
    std::vector<size_t> on;  // counted phases of this thread within a step, by start
    for (size_t j = 0; j < rows.size(); ++j)
      if (e.tid[rows[j]] == t && phase_of(c, e.name[rows[j]]) >= 0 && s.phase_step[j] >= 0) on.push_back(j);
    if (on.empty()) continue;
    std::stable_sort(on.begin(), on.end(), [&](size_t a, size_t b) { return e.start[rows[a]] < e.start[rows[b]]; });
    std::vector<int64_t> starts(on.size());
    for (size_t k = 0; k < on.size(); ++k) starts[k] = e.start[rows[on[k]]];
    std::vector<std::pair<size_t, int64_t>> cuts;  // taken from one snapshot, then applied
    for (size_t w : windows) {
      if (e.tid[w] != t) continue;
      int64_t ws = e.start[w], we = e.end[w];
      int64_t at = int64_t(std::upper_bound(starts.begin(), starts.end(), ws) - starts.begin()) - 1;
      for (int back = 0; back < 4; ++back) {  // phases nest a level or two: walk out
        int64_t k = at - back;
        if (k < 0) break;
        size_t j = on[size_t(k)];
        if (e.end[rows[j]] >= we) {
          cuts.emplace_back(j, std::min(we - ws, s.phase_exclusive[j]));
          break;
        }
      }
    }
    for (auto [j, cut] : cuts) {
      s.phase_exclusive[j] -= cut;
      taken[size_t(s.phase_step[j])] += cut;
    }
  }
  return taken;
}

// _covered_per_step: per step, the length of the union of its phases, each clipped to the step's end.
std::vector<int64_t> covered(const StepPhases& s, const EventColumns& e, const std::vector<size_t>& rows) {
  std::vector<int64_t> out(s.step_row.size(), 0);
  std::vector<size_t> order;
  for (size_t j = 0; j < rows.size(); ++j)
    if (s.phase_step[j] >= 0) order.push_back(j);
  bool sorted = true;
  for (size_t k = 1; k < order.size() && sorted; ++k) {
    int64_t a = s.phase_step[order[k - 1]], b = s.phase_step[order[k]];
    sorted = a < b || (a == b && e.start[rows[order[k - 1]]] <= e.start[rows[order[k]]]);
  }
  if (!sorted)
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      int64_t sa = s.phase_step[a], sb = s.phase_step[b];
      return sa != sb ? sa < sb : e.start[rows[a]] < e.start[rows[b]];
    });
  int64_t step = -1, from = 0, reach = 0;
  for (size_t j : order) {
    int64_t st = s.phase_step[j], a = e.start[rows[j]], b = std::min(e.end[rows[j]], s.step_end[size_t(st)]);
    if (st != step || a > reach) {
      if (step >= 0) out[size_t(step)] += reach - from;
      step = st, from = a, reach = b;
    } else {
      reach = std::max(reach, b);
    }
  }
  if (step >= 0) out[size_t(step)] += reach - from;
  return out;
}

}  // namespace

StepPhases step_phases(const EventColumns& e, const Codes& c) {
  StepPhases s;
  find_steps(e, c, s);
  std::vector<size_t> rows;  // phase spans, in event order
  for (size_t i = 0; i < e.n; ++i)
    if (is(e, i, c.cat_phase, c.kind_span)) rows.push_back(i);
  for (size_t i : rows) s.phase_row.push_back(int64_t(i));
  attribute(s, e, rows);
  s.phase_exclusive.resize(rows.size());
  for (size_t j = 0; j < rows.size(); ++j) s.phase_exclusive[j] = e.end[rows[j]] - e.start[rows[j]];
  std::vector<size_t> counted;
  for (size_t j = 0; j < rows.size(); ++j)
    if (phase_of(c, e.name[rows[j]]) >= 0) counted.push_back(j);
  exclusive(e, rows, counted, s.phase_exclusive);  // only the five phases nest here
  size_t n = s.step_row.size();
  for (auto& v : s.phase_sum) v.assign(n, 0);
  s.other.resize(n);
  for (size_t k = 0; k < n; ++k) s.other[k] = s.step_end[k] - s.step_start[k];
  if (rows.empty() || n == 0) return s;
  std::vector<int64_t> taken = take_out_windows(s, e, c, rows);
  for (size_t j : counted)
    if (s.phase_step[j] >= 0) s.phase_sum[phase_of(c, e.name[rows[j]])][size_t(s.phase_step[j])] += s.phase_exclusive[j];
  std::vector<int64_t> cover = covered(s, e, rows);
  for (size_t k = 0; k < n; ++k) {
    int64_t inside = taken.empty() ? cover[k] : std::max<int64_t>(cover[k] - taken[k], 0);
    s.other[k] = std::max<int64_t>(s.other[k] - inside, 0);
  }
  return s;
}

}  // namespace aggregate
}  // namespace stepscope
