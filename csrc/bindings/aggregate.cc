// Bindings of the analysis's native passes: NumPy columns in, NumPy columns out (no
// copies either way: inputs are read in place, outputs own their vectors).
#include "bindings/aggregate.h"

#include <nanobind/ndarray.h>

#include <string>

#include "aggregate/attribution.h"
#include "aggregate/kernel_steps.h"
#include "aggregate/step_phases.h"
#include "bindings/numpy.h"

namespace nb = nanobind;

namespace stepscope {
namespace bindings {
namespace {

template <typename T>
using Column = nb::ndarray<const T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;


nb::dict step_phases_py(Column<int8_t> kind, Column<int8_t> category, Column<int32_t> name, Column<int64_t> tid,
                        Column<int64_t> start, Column<int64_t> end, Column<int64_t> arg, Column<int8_t> phase_of_name,
                        Column<uint8_t> op_window_name, int kind_instant, int kind_span, int cat_step, int cat_phase,
                        int cat_framework, int32_t end_mark, int32_t interrupted) {
  size_t n = kind.shape(0);
  for (size_t m : {category.shape(0), name.shape(0), tid.shape(0), start.shape(0), end.shape(0), arg.shape(0)})
    if (m != n) throw nb::value_error("step_phases: the event columns differ in length");
  if (phase_of_name.shape(0) != op_window_name.shape(0))
    throw nb::value_error("step_phases: phase_of_name and op_window_name differ in length");
  aggregate::EventColumns e{n, kind.data(), category.data(), name.data(), tid.data(), start.data(), end.data(), arg.data()};
  aggregate::Codes c;
  c.kind_instant = kind_instant, c.kind_span = kind_span;
  c.cat_step = cat_step, c.cat_phase = cat_phase, c.cat_framework = cat_framework;
  c.end_mark = end_mark, c.interrupted = interrupted;
  c.names = int32_t(phase_of_name.shape(0));
  c.phase_of_name = phase_of_name.data();
  c.op_window_name = op_window_name.data();
  aggregate::StepPhases s;
  {
    nb::gil_scoped_release nogil;
    s = aggregate::step_phases(e, c);
  }
  nb::dict d;
  d["step_row"] = to_numpy(std::move(s.step_row));
  d["step_tid"] = to_numpy(std::move(s.step_tid));
  d["step_start"] = to_numpy(std::move(s.step_start));
  d["step_end"] = to_numpy(std::move(s.step_end));
  d["step_interrupted"] = to_numpy(std::move(s.step_interrupted));
  d["interrupt_marks"] = s.interrupt_marks;
  nb::list sums;
  for (auto& v : s.phase_sum) sums.append(to_numpy(std::move(v)));
  d["phase_sums"] = sums;
  d["other"] = to_numpy(std::move(s.other));
  d["phase_row"] = to_numpy(std::move(s.phase_row));
  d["phase_step"] = to_numpy(std::move(s.phase_step));
  d["phase_exclusive"] = to_numpy(std::move(s.phase_exclusive));
  return d;
}

nb::dict groups_dict(aggregate::KernelGroups& g, bool by_phase) {
  nb::dict d;
  d["process"] = to_numpy(std::move(g.process));
  d["device"] = to_numpy(std::move(g.device));
  d["mode"] = to_numpy(std::move(g.mode));
  d["step"] = to_numpy(std::move(g.step));
  d["kernels"] = to_numpy(std::move(g.kernels));
  d["kernel_ns"] = to_numpy(std::move(g.kernel_ns));
  d["busy_ns"] = to_numpy(std::move(g.busy_ns));
  d["launch_gap_ns"] = to_numpy(std::move(g.launch_gap_ns));
  if (by_phase) {
    d["phase"] = to_numpy(std::move(g.phase));
  } else {
    d["gap_ns"] = to_numpy(std::move(g.gap_ns));
    d["launch_gaps"] = to_numpy(std::move(g.launch_gaps));
    d["kernel_ns_median"] = to_numpy(std::move(g.kernel_ns_median));
    d["launch_gap_ns_median"] = to_numpy(std::move(g.launch_gap_ns_median));
    d["launch_latency_ns_median"] = to_numpy(std::move(g.launch_latency_ns_median));
  }
  return d;
}

nb::dict kernel_steps_py(Column<int64_t> process, Column<int64_t> device, Column<int64_t> start, Column<int64_t> end,
                         Column<int64_t> step, Column<int64_t> mode, Column<int64_t> phase, Column<int64_t> duration,
                         Column<double> launched, Column<double> latency, double max_gap_ns, int64_t launch_slack_ns) {
  size_t n = process.shape(0);
  for (size_t m : {device.shape(0), start.shape(0), end.shape(0), step.shape(0), mode.shape(0), phase.shape(0),
                   duration.shape(0), launched.shape(0), latency.shape(0)})
    if (m != n) throw nb::value_error("kernel_steps: the kernel columns differ in length");
  aggregate::KernelColumns k{n, process.data(), device.data(), start.data(), end.data(), step.data(),
                             mode.data(), phase.data(), duration.data(), launched.data(), latency.data()};
  aggregate::KernelAggregates a;
  {
    nb::gil_scoped_release nogil;
    a = aggregate::kernel_steps(k, max_gap_ns, launch_slack_ns);
  }
  nb::dict d;
  d["steps"] = groups_dict(a.steps, false);
  d["phases"] = groups_dict(a.phases, true);
  return d;
}

nb::tuple innermost_segments_py(Column<int64_t> start, Column<int64_t> end) {
  if (start.shape(0) != end.shape(0)) throw nb::value_error("innermost_segments: start and end differ in length");
  aggregate::Segments s;
  {
    nb::gil_scoped_release nogil;
    s = aggregate::innermost_segments(start.data(), end.data(), start.shape(0));
  }
  return nb::make_tuple(to_numpy(std::move(s.start)), to_numpy(std::move(s.end)), to_numpy(std::move(s.span)));
}

// (value_k[row] for each values_k, -1 where no row) of the interval each time falls in
nb::list attribute_py(Column<int64_t> start, Column<int64_t> end, nb::list values, Column<int64_t> times) {
  const size_t m = start.shape(0), n = times.shape(0);
  if (end.shape(0) != m) throw nb::value_error("attribute: start and end differ in length");
  std::vector<Column<int64_t>> columns;
  for (nb::handle v : values) {
    columns.push_back(nb::cast<Column<int64_t>>(v));
    if (columns.back().shape(0) != m) throw nb::value_error("attribute: a value column differs from start in length");
  }
  std::vector<int64_t> row(n);
  std::vector<std::vector<int64_t>> outs(columns.size(), std::vector<int64_t>(n));
  {
    nb::gil_scoped_release nogil;
    aggregate::lookup(aggregate::Intervals{start.data(), end.data(), m}, times.data(), n, row.data());
    for (size_t k = 0; k < columns.size(); ++k) {
      const int64_t* v = columns[k].data();
      int64_t* o = outs[k].data();
      for (size_t i = 0; i < n; ++i) o[i] = row[i] >= 0 ? v[row[i]] : -1;
    }
  }
  nb::list out;
  for (auto& o : outs) out.append(to_numpy(std::move(o)));
  return out;
}

}  // namespace

void add_aggregate(nb::module_& m) {
  m.def("innermost_segments", &innermost_segments_py, nb::arg("start"), nb::arg("end"),
        "Phase spans of one process as non-overlapping segments naming the innermost span covering each "
        "(csrc/aggregate/attribution.h): (segment starts, segment ends, span indexes), in time order.");
  m.def("attribute", &attribute_py, nb::arg("start"), nb::arg("end"), nb::arg("values"), nb::arg("times"),
        "For intervals sorted by start and times: per value column, its value at the interval each time falls "
        "in (the last starting at or before it, if not ended), -1 where none (csrc/aggregate/attribution.h).");
  m.def("kernel_steps", &kernel_steps_py, nb::arg("process"), nb::arg("device"), nb::arg("start"), nb::arg("end"),
        nb::arg("step"), nb::arg("mode"), nb::arg("phase"), nb::arg("duration"), nb::arg("launched"),
        nb::arg("latency"), nb::arg("max_gap_ns"), nb::arg("launch_slack_ns"),
        "Compute kernels in (process, device, start) order aggregated per (process, device, mode, step) and per "
        "phase besides (csrc/aggregate/kernel_steps.h): {'steps': columns, 'phases': columns}.");
  m.def("step_phases", &step_phases_py, nb::arg("kind"), nb::arg("category"), nb::arg("name"), nb::arg("tid"),
        nb::arg("start"), nb::arg("end"), nb::arg("arg"), nb::arg("phase_of_name"), nb::arg("op_window_name"),
        nb::arg("kind_instant"), nb::arg("kind_span"), nb::arg("cat_step"), nb::arg("cat_phase"),
        nb::arg("cat_framework"), nb::arg("end_mark"), nb::arg("interrupted"),
        "One process's steps and phases from its events in start order (csrc/aggregate/step_phases.h): "
        "step rows, their ends, interrupted flags, the five phases' exclusive sums and Other; each "
        "phase span's row, step (index into the steps, -1: none) and exclusive time.");
}

}  // namespace bindings
}  // namespace stepscope
