// Python bindings. The per-event entry points (annotate's Span object, span,
// instant, counter, now) use the CPython API directly with METH_FASTCALL
// (bindings/hot.cc): they are the hottest calls in the product. Everything else
// uses nanobind, here; the torch part's types are a submodule of their own
// (torch/submodule.cc).
#include <Python.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cxxabi.h>

#include <cstdlib>

#include "record/cupti.h"
#include "record/gpu.h"
#include "bindings/aggregate.h"
#include "bindings/hot.h"
#include "bindings/numpy.h"
#include "common/around.h"
#include "record/pysampler.h"
#include "read/reader.h"
#include "common/pyint.h"
#include "record/recorder.h"
#include "record/sampler.h"
#include "record/settings.h"
#include "steps/steps.h"
#include "torch/submodule.h"

namespace nb = nanobind;
using namespace stepscope;

namespace {

using bindings::to_numpy;

nb::str text_of(const std::string& s);
nb::list texts_of(const std::vector<std::string>& v);

nb::dict read_trace_py(const std::string& path, uint32_t part, uint32_t parts, uint64_t part_bytes, bool with_events,
                       bool with_gpu) {
  Columns c;
  {
    nb::gil_scoped_release nogil;
    try {
      c = read_trace(path, part, parts, part_bytes, with_events, with_gpu);
    } catch (const FormatError& e) {
      nb::gil_scoped_acquire gil;
      throw nb::value_error(e.what());
    }
  }
  nb::dict d;
  d["kind"] = to_numpy(std::move(c.kind));
  d["category"] = to_numpy(std::move(c.cat));
  d["name"] = to_numpy(std::move(c.name));
  d["track"] = to_numpy(std::move(c.track));
  d["start"] = to_numpy(std::move(c.start));
  d["end"] = to_numpy(std::move(c.end));
  d["arg"] = to_numpy(std::move(c.arg));
  d["step"] = to_numpy(std::move(c.step));
  d["value"] = to_numpy(std::move(c.value));
  d["names"] = texts_of(c.names);
  d["valid_end"] = c.valid_end;
  d["gpu_chunks"] = c.gpu_chunks;
  nb::list tracks;
  for (auto& t : c.tracks) tracks.append(nb::make_tuple(t.id, t.tid, t.kind, text_of(t.name)));
  d["tracks"] = tracks;
  GpuColumns& g = c.gpu;
  nb::dict gpu;
  gpu["type"] = to_numpy(std::move(g.type));
  gpu["sub"] = to_numpy(std::move(g.sub));
  gpu["sub2"] = to_numpy(std::move(g.sub2));
  gpu["device"] = to_numpy(std::move(g.device));
  gpu["stream"] = to_numpy(std::move(g.stream));
  gpu["name"] = to_numpy(std::move(g.name));
  gpu["config"] = to_numpy(std::move(g.config));
  gpu["correlation"] = to_numpy(std::move(g.correlation));
  gpu["thread"] = to_numpy(std::move(g.thread));
  gpu["start"] = to_numpy(std::move(g.start));
  gpu["end"] = to_numpy(std::move(g.end));
  gpu["bytes"] = to_numpy(std::move(g.bytes));
  gpu["track"] = to_numpy(std::move(g.track));
  gpu["configs"] = to_numpy(std::move(g.configs));
  d["gpu"] = gpu;
  PyColumns& y = c.py;  // Python stack samples (1.2)
  nb::dict py;
  for (auto [k, v] : {std::pair{"frame_func", &y.frame_func}, {"frame_file", &y.frame_file}, {"stack_frame", &y.stack_frame}, {"stack", &y.stack}})
    py[k] = to_numpy(std::move(*v));
  for (auto [k, v] : {std::pair{"frame_line", &y.frame_line}, {"stack_parent", &y.stack_parent}}) py[k] = to_numpy(std::move(*v));
  py["time"] = to_numpy(std::move(y.time));
  py["tid"] = to_numpy(std::move(y.tid));
  py["strings"] = texts_of(y.strings);
  py["interval_ns"] = y.interval_ns;
  d["py"] = py;
  d["header"] = nb::bytes(c.header_json.data(), c.header_json.size());
  d["version"] = nb::make_tuple(c.major, c.minor);
  d["dropped"] = c.dropped;
  d["written"] = c.written;
  d["clean_close"] = c.clean_close;
  d["warnings"] = texts_of(c.warnings);
  return d;
}

}  // namespace

namespace {
// Text from a trace file as str: invalid UTF-8 (a thread name cut mid-character at the
// OS's 15 bytes, damage) becomes U+FFFD rather than failing the whole read.
nb::str text_of(const std::string& s) {
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), Py_ssize_t(s.size()), "replace");
  if (!o) throw nb::python_error();
  return nb::steal<nb::str>(o);
}

nb::list texts_of(const std::vector<std::string>& v) {
  nb::list out;
  for (const std::string& s : v) out.append(text_of(s));
  return out;
}
}  // namespace

NB_MODULE(_native, m) {
  m.doc() = "stepscope's native tracing core";
  init_clock();

  if (!bindings::add_hot(m.ptr()) || PyModule_AddFunctions(m.ptr(), pysampler_methods()) < 0)
    throw nb::python_error();
  if (!add_step_tracker(m.ptr()) || !add_around(m.ptr()) || !add_torch_submodule(m.ptr()))
    throw nb::python_error();
  if (!add_settings(m.ptr())) throw nb::python_error();
  bindings::add_aggregate(m);

  m.attr("CATEGORIES") = nb::make_tuple("annotation", "phase", "step", "op", "module", "system",
                                        "gpu", "counter", "internal", "framework", "comm");
  m.attr("FORMAT_VERSION") = nb::make_tuple(kFormatMajor, kFormatMinor);
  m.attr("MAX_NAMES") = kMaxNames;
  m.attr("MAX_NAME_BYTES") = kMaxNameBytes;
  m.attr("OVERFLOW_NAME") = kOverflowName;

  m.def("intern", [](nb::handle name) {
    int64_t id = bindings::intern_obj(name.ptr());
    if (id < 0) throw nb::python_error();
    return uint32_t(id);
  }, "Interns a name and returns its id.");
  m.def("set_decorators", [](nb::object decorate, nb::object bare) {
    bindings::set_decorators(decorate.release().ptr(), bare.release().ptr());
  });
  m.def("begin_step", [](nb::handle mode, uint64_t at) {
    int64_t id = bindings::intern_obj(mode.ptr());
    if (id < 0) throw nb::python_error();
    return begin_step(uint32_t(id), at);
  }, nb::arg("mode"), nb::arg("at") = 0,
     "Marks the start of a new step of `mode` at tick `at` (0: now); returns its number.");
  m.def("end_step", [](uint64_t at, uint64_t thread) { thread ? end_step_of_thread(thread, at) : end_step(at); },
        nb::arg("at") = 0, nb::arg("thread") = 0,
        "Marks the end of the calling thread's step at tick `at` (0: now); `thread`: end the "
        "step of that thread's loop instead (its native id), from another thread.");
  m.def("interrupt_step", [](uint64_t at) { return interrupt_step(at); }, nb::arg("at") = 0,
        "Flags the calling thread's open step as interrupted (it ended without its optimizer "
        "step, SPEC §3): readers keep its time, with mode 'interrupted'. False: no step is open.");
  m.def("void_step", [](uint64_t at) { return void_step(at); }, nb::arg("at") = 0,
        "Voids the calling thread's open step: the call it began met the end of the data "
        "(readers take its begin as an end; its number goes to the next step). False: none open.");
  m.def("current_step", [] { return g_step.load(); });
  m.def("open", [](const std::string& path, const std::string& header_json, int flush_ms,
                   size_t buffer_bytes, uint64_t disk_floor_bytes, double disk_floor_fraction) {
    WriterOptions o{path, header_json, flush_ms, buffer_bytes, disk_floor_bytes, disk_floor_fraction};
    return open_writer(o);
  }, nb::arg("path"), nb::arg("header_json"), nb::arg("flush_interval_ms") = 1000,
     nb::arg("buffer_bytes") = size_t(32) << 20, nb::arg("disk_floor_bytes") = 0,
     nb::arg("disk_floor_fraction") = 0.0,
     "Starts writing events to a new trace file; returns '' or the reason it cannot.");
  m.def("close", [] {
    nb::gil_scoped_release nogil;
    close_writer();
  }, "Flushes everything and closes the trace file.");
  m.def("stats", [] {
    WriterStats s = writer_stats();
    nb::dict d;
    d["written"] = s.written;
    d["dropped"] = s.dropped;
    d["bytes"] = s.bytes;
    d["chunks_in_use"] = s.chunks_in_use;
    d["chunk_bytes"] = sizeof(Chunk);
    d["names_folded"] = s.names_folded;
    d["error"] = s.error;
    return d;
  });
  m.def("clock_info", [] {
    nb::dict d;
    d["source"] = converter().source();
    d["ticks_per_ns"] = converter().ticks_per_ns();
    return d;
  });
  m.def("start_sampler", [](int interval_ms, bool node, bool processes) {
    return start_sampler(interval_ms, node, processes);
  }, nb::arg("interval_ms"), nb::arg("node"), nb::arg("processes"),
        "Starts the system sampler; returns notes on metrics that cannot be measured.");
  m.def("stop_sampler", [] {
    nb::gil_scoped_release nogil;
    stop_sampler();
  });
  m.def("sampler_pass_ns", [](int passes) {
    nb::gil_scoped_release nogil;
    return sampler_pass_ns(passes);
  }, "Benchmark: ns per sampling pass of the running sampler (-1 if none runs).");
  m.def("read_trace", &read_trace_py, nb::arg("path"), nb::arg("part") = 0, nb::arg("parts") = 1,
        nb::arg("part_bytes") = 0, nb::arg("events") = true, nb::arg("gpu") = true,
        "Decodes one trace file into numpy columns (parts > 1: the part-th group of its event and GPU chunks; "
        "part_bytes > 0: the chunks that start in the part-th part_bytes of the file; events/gpu False: those "
        "chunks are left undecoded). valid_end: the offset after the last complete chunk; gpu_chunks: the "
        "GPU chunks of the part, decoded or not.");
  m.attr("GPU_TYPES") = nb::make_tuple("kernel", "memcpy", "memset", "sync", "runtime", "driver");
  m.def("launch_config", [](std::vector<uint32_t> grid, std::vector<uint32_t> block, uint32_t registers,
                            uint32_t static_smem, uint32_t dynamic_smem) {
    if (grid.size() != 3 || block.size() != 3) throw nb::value_error("grid and block are (x, y, z)");
    LaunchConfig c{{grid[0], grid[1], grid[2]}, {block[0], block[1], block[2]}, registers, static_smem,
                   dynamic_smem};
    return intern_launch_config(c);
  }, nb::arg("grid"), nb::arg("block"), nb::arg("registers") = 0, nb::arg("static_smem") = 0,
     nb::arg("dynamic_smem") = 0, "Interns a kernel launch configuration; returns its id.");
  m.def("gpu_record", [](uint8_t type, uint64_t start_ns, uint64_t end_ns, uint32_t correlation,
                         uint32_t device, uint32_t stream, uint32_t name, uint8_t sub, uint8_t sub2,
                         uint64_t bytes, uint32_t thread, uint32_t config) {
    // The write path CUPTI's decoder uses, for tests and fixtures without a GPU.
    if (type >= kNumGpuTypes) throw nb::value_error("type must be 0..5 (see GPU_TYPES)");
    if (!check_name_id(name)) throw nb::python_error();
    if (!g_enabled.load()) return false;
    GpuRecord r{start_ns, end_ns, bytes, device, stream, name, config, correlation, thread, type, sub, sub2};
    return gpu_enqueue(&r, 1) == 0;
  }, nb::arg("type"), nb::arg("start_ns"), nb::arg("end_ns"), nb::arg("correlation") = 0,
     nb::arg("device") = 0, nb::arg("stream") = 0, nb::arg("name") = 0, nb::arg("sub") = 0,
     nb::arg("sub2") = 0, nb::arg("bytes") = 0, nb::arg("thread") = 0, nb::arg("config") = 0,
     "Queues one GPU activity record (times: CLOCK_MONOTONIC ns; name: an interned id).");
  m.def("cupti_start", [](const std::string& library) {
    CuptiStart r;
    {
      nb::gil_scoped_release nogil;
      r = cupti_start(library);
    }
    return nb::make_tuple(r.ok, r.no_device, r.message);
  }, nb::arg("library"), "Starts CUPTI activity tracing; returns (ok, no_device, message).");
  m.def("cupti_stop", [] {
    nb::gil_scoped_release nogil;
    cupti_stop();
  }, "Stops CUPTI tracing and flushes its buffers into the trace.");
  m.def("cupti_pause", [] {
    nb::gil_scoped_release nogil;
    return cupti_pause();
  });
  m.def("cupti_resume", [] {
    nb::gil_scoped_release nogil;
    return cupti_resume();
  });
  m.def("cupti_set_steps", [](int32_t first, int32_t last) {
    nb::gil_scoped_release nogil;
    cupti_set_steps(first, last, intern("train"));
  }, "Traces GPU activity only during train steps first..last (STEPSCOPE_STEPS).");
  m.def("cupti_status", [] {
    nb::dict d;
    d["active"] = cupti_active();
    d["clock"] = cupti_clock_mapping();
    d["dropped"] = cupti_dropped();
    return d;
  });
  m.def("cupti_layout", [] {
    nb::dict d;
    for (auto& [k, v] : cupti_layout()) d[k.c_str()] = v;
    return d;
  }, "Byte offsets of the CUPTI record fields the decoder reads.");
  m.def("demangle", [](const std::vector<std::string>& names) {
    std::vector<std::string> out;
    out.reserve(names.size());
    for (const std::string& n : names) {
      int status = 0;
      char* d = abi::__cxa_demangle(n.c_str(), nullptr, nullptr, &status);
      out.push_back(status == 0 && d ? d : n);
      std::free(d);
    }
    return out;
  }, "C++ names demangled (a name that is not mangled comes back as is).");
  m.def("bench_cpp_pair", [](uint64_t n, uint32_t name) {
    // The C++ API's cost per begin+end pair, as an integration in C++ sees it.
    nb::gil_scoped_release nogil;
    int64_t t_start = mono_ns();
    for (uint64_t i = 0; i < n; ++i) {
      uint64_t t0 = ticks();
      record_span(kCatPhase, name, t0, ticks());
    }
    return double(mono_ns() - t_start) / double(n);
  });
}
