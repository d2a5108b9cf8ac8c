// Python bindings. The per-event entry points (annotate's Span object, span,
// instant, counter, now) use the CPython API directly with METH_FASTCALL:
// they are the hottest calls in the product. Everything else uses nanobind.
#include <Python.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cxxabi.h>

#include <cstdlib>

#include "record/cupti.h"
#include "record/gpu.h"
#include "common/around.h"
#include "torch/hooks.h"
#include "torch/loop.h"
#include "torch/optimizer_hooks.h"
#include "torch/passes.h"
#include "torch/roots.h"
#include "record/pysampler.h"
#include "read/reader.h"
#include "common/pyint.h"
#include "record/recorder.h"
#include "record/sampler.h"
#include "record/settings.h"
#include "steps/steps.h"

namespace nb = nanobind;
using namespace stepscope;

namespace {

PyObject* g_name_cache = nullptr;  // str -> int: interning without leaving C
PyObject* g_decorate = nullptr;    // python: (name, category, func) -> wrapper
PyObject* g_decorate_bare = nullptr;  // python: (func) -> wrapper

constexpr uint32_t kUnresolved = UINT32_MAX;  // a Span made while nothing recorded

// Returns the interned id of a str, or -1 with a Python error set. A name folded
// into the overflow name (the table is full) is not cached: the cache stays bounded.
int64_t intern_obj(PyObject* name) {
  PyObject* v = PyDict_GetItemWithError(g_name_cache, name);
  if (v) return int64_t(PyLong_AsUnsignedLong(v));
  if (PyErr_Occurred()) return -1;
  if (!PyUnicode_Check(name)) {
    PyErr_Format(PyExc_TypeError, "a name must be a str, not %.100s", Py_TYPE(name)->tp_name);
    return -1;
  }
  Py_ssize_t n;
  const char* s = PyUnicode_AsUTF8AndSize(name, &n);
  if (!s) return -1;
  bool folded = false;
  uint32_t id = intern(std::string(s, size_t(n)), &folded);
  if (folded) return id;
  PyObject* idobj = PyLong_FromUnsignedLong(id);
  if (!idobj || PyDict_SetItem(g_name_cache, name, idobj) < 0) {
    Py_XDECREF(idobj);
    return -1;
  }
  Py_DECREF(idobj);
  return id;
}

// ------------------------------------------------------------------ Span

struct SpanObject {
  PyObject_HEAD
  uint64_t t0;  // 0 = not running
  uint32_t name;
  uint8_t cat;
  PyObject* pyname;
};

PyTypeObject SpanType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// A small free list: annotate() objects are created and dropped at high rates.
// _Py_NewReference is not public API; without it, plain allocation is used.
#if PY_VERSION_HEX < 0x030D0000
constexpr int kFreeMax = 64;
#else
constexpr int kFreeMax = 0;
#endif
SpanObject* g_free_spans[kFreeMax > 0 ? kFreeMax : 1];
int g_free_count = 0;

SpanObject* new_span(PyObject* pyname, uint32_t name, uint8_t cat) {
  SpanObject* s;
  if (g_free_count > 0) {
    s = g_free_spans[--g_free_count];
#if PY_VERSION_HEX < 0x030D0000
    _Py_NewReference(reinterpret_cast<PyObject*>(s));
#endif
  } else {
    s = PyObject_New(SpanObject, &SpanType);
    if (!s) return nullptr;
  }
  s->t0 = 0;
  s->name = name;
  s->cat = cat;
  Py_INCREF(pyname);
  s->pyname = pyname;
  return s;
}

void span_dealloc(PyObject* self) {
  auto* s = reinterpret_cast<SpanObject*>(self);
  Py_CLEAR(s->pyname);
  if (g_free_count < kFreeMax) {
    g_free_spans[g_free_count++] = s;
  } else {
    PyObject_Free(self);
  }
}

// A Span made while nothing recorded has no name id yet: a program that names
// spans by item costs no memory until a session records them.
bool resolve_name(SpanObject* s) {
  if (s->name != kUnresolved) return true;
  const int64_t id = intern_obj(s->pyname);
  if (id < 0) {
    PyErr_Clear();  // a str whose text cannot be encoded: not recorded
    return false;
  }
  s->name = uint32_t(id);
  return true;
}

PyObject* span_enter(PyObject* self, PyObject*) {
  auto* s = reinterpret_cast<SpanObject*>(self);
  s->t0 = g_enabled.load(std::memory_order_relaxed) && resolve_name(s) ? ticks() : 0;
  Py_INCREF(self);
  return self;
}

PyObject* span_exit(PyObject* self, PyObject* const*, Py_ssize_t) {
  auto* s = reinterpret_cast<SpanObject*>(self);
  if (s->t0) {
    record_span(s->cat, s->name, s->t0, ticks());
    s->t0 = 0;
  }
  Py_RETURN_NONE;
}

PyObject* span_call(PyObject* self, PyObject* args, PyObject* kwargs) {
  auto* s = reinterpret_cast<SpanObject*>(self);
  PyObject* func;
  if (kwargs || !PyArg_UnpackTuple(args, "annotate", 1, 1, &func)) {
    PyErr_SetString(PyExc_TypeError, "annotate(name) decorates exactly one function");
    return nullptr;
  }
  if (!g_decorate) {
    PyErr_SetString(PyExc_RuntimeError, "stepscope is not initialised");
    return nullptr;
  }
  PyObject* cat = PyLong_FromLong(s->cat);
  PyObject* r = PyObject_CallFunctionObjArgs(g_decorate, s->pyname, cat, func, nullptr);
  Py_XDECREF(cat);
  return r;
}

PyObject* span_repr(PyObject* self) {
  auto* s = reinterpret_cast<SpanObject*>(self);
  return PyUnicode_FromFormat("<stepscope.annotate %R>", s->pyname);
}

PyObject* span_get_name(PyObject* self, void*) {
  auto* s = reinterpret_cast<SpanObject*>(self);
  Py_INCREF(s->pyname);
  return s->pyname;
}

PyMethodDef span_methods[] = {
    {"__enter__", span_enter, METH_NOARGS, nullptr},
    {"__exit__", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(span_exit)),
     METH_FASTCALL, nullptr},
    {nullptr, nullptr, 0, nullptr}};

PyGetSetDef span_getset[] = {{"name", span_get_name, nullptr, "the annotation's name", nullptr},
                             {nullptr, nullptr, nullptr, nullptr, nullptr}};

// ------------------------------------------------------- module functions

bool arg_u64(PyObject* o, uint64_t* out) {
  unsigned long long v;
  bool ok = u64_of(o, &v);
  *out = v;
  return ok;
}

// A name id from Python, which must be one intern() returned: a made-up id would reach
// the trace and make every reader look up a name that was never written.
bool arg_name(PyObject* o, uint64_t* out) {
  return arg_u64(o, out) && stepscope::check_name_id(*out);
}

// annotate(name, category=0) -> Span; annotate(func) decorates with func's name.
PyObject* py_annotate(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 1 || nargs > 2) {
    PyErr_SetString(PyExc_TypeError, "annotate(name, category=0)");
    return nullptr;
  }
  PyObject* name = args[0];
  if (!PyUnicode_Check(name) && PyCallable_Check(name) && nargs == 1 && g_decorate_bare)
    return PyObject_CallOneArg(g_decorate_bare, name);
  if (!PyUnicode_Check(name)) {
    PyErr_Format(PyExc_TypeError, "a name must be a str, not %.100s", Py_TYPE(name)->tp_name);
    return nullptr;
  }
  int64_t id = kUnresolved;  // interned when it first records
  if (g_enabled.load(std::memory_order_relaxed) && (id = intern_obj(name)) < 0) return nullptr;
  long cat = nargs == 2 ? PyLong_AsLong(args[1]) : kCatAnnotation;
  if (cat < 0 || cat >= kNumCategories) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "category must be in 0..15");
    return nullptr;
  }
  return reinterpret_cast<PyObject*>(new_span(name, uint32_t(id), uint8_t(cat)));
}

// phase(name): a span of category phase; only the canonical phase names.
constexpr const char* kPhaseNames[] = {"GetNext", "Forward", "Loss", "Backward", "Optimizer",
                                       "Recompute"};
constexpr uint32_t kNumPhases = sizeof(kPhaseNames) / sizeof(kPhaseNames[0]);

PyObject* py_phase(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 1) {
    PyErr_SetString(PyExc_TypeError, "phase(name)");
    return nullptr;
  }
  int64_t id = intern_obj(args[0]);
  if (id < 0) return nullptr;
  if (uint64_t(id) >= kNumPhases) {  // the phase names were interned first: ids 0..5
    PyErr_Format(PyExc_ValueError,
                 "phase %R is not valid; allowed: GetNext, Forward, Loss, Backward, Optimizer, "
                 "Recompute",
                 args[0]);
    return nullptr;
  }
  return reinterpret_cast<PyObject*>(new_span(args[0], uint32_t(id), kCatPhase));
}

PyObject* py_annotation_begin(PyObject* m, PyObject* const* args, Py_ssize_t nargs) {
  PyObject* s = py_annotate(m, args, nargs);
  if (s && Py_TYPE(s) == &SpanType) {
    auto* span = reinterpret_cast<SpanObject*>(s);
    span->t0 = g_enabled.load(std::memory_order_relaxed) && resolve_name(span) ? ticks() : 0;
  }
  return s;
}

PyObject* py_annotation_end(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 1 || Py_TYPE(args[0]) != &SpanType) {
    PyErr_SetString(PyExc_TypeError, "annotation_end() takes the object annotation_begin() returned");
    return nullptr;
  }
  return span_exit(args[0], nullptr, 0);
}

PyObject* py_now(PyObject*, PyObject*) { return PyLong_FromUnsignedLongLong(ticks()); }

PyObject* py_enabled(PyObject*, PyObject*) {
  return PyBool_FromLong(g_enabled.load(std::memory_order_relaxed));
}

// span(category, name_id, t0, t1=now, arg=None): a complete span in ticks.
PyObject* py_span(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 3 || nargs > 5) {
    PyErr_SetString(PyExc_TypeError, "span(category, name_id, t0, t1=None, arg=None)");
    return nullptr;
  }
  if (!g_enabled.load(std::memory_order_relaxed)) Py_RETURN_NONE;
  uint64_t cat, name, t0, t1, arg = 0;
  if (!arg_u64(args[0], &cat) || !arg_name(args[1], &name) || !arg_u64(args[2], &t0)) return nullptr;
  if (nargs >= 4 && args[3] != Py_None) {
    if (!arg_u64(args[3], &t1)) return nullptr;
  } else {
    t1 = ticks();
  }
  const bool has_arg = nargs == 5 && args[4] != Py_None;
  if (has_arg && !arg_u64(args[4], &arg)) return nullptr;
  record_span(uint8_t(cat & 15), uint32_t(name), t0, t1, arg, has_arg);
  Py_RETURN_NONE;
}

// instant(category, name_id, arg=None)
PyObject* py_instant(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 2 || nargs > 3) {
    PyErr_SetString(PyExc_TypeError, "instant(category, name_id, arg=None)");
    return nullptr;
  }
  if (!g_enabled.load(std::memory_order_relaxed)) Py_RETURN_NONE;
  uint64_t cat, name, arg = 0;
  if (!arg_u64(args[0], &cat) || !arg_name(args[1], &name)) return nullptr;
  const bool has_arg = nargs == 3 && args[2] != Py_None;
  if (has_arg && !arg_u64(args[2], &arg)) return nullptr;
  record_instant(uint8_t(cat & 15), uint32_t(name), arg, has_arg);
  Py_RETURN_NONE;
}

// counter(category, name_id, value, arg=None, at=None): at = ticks, for a sample's shared time
PyObject* py_counter(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 3 || nargs > 5) {
    PyErr_SetString(PyExc_TypeError, "counter(category, name_id, value, arg=None, at=None)");
    return nullptr;
  }
  if (!g_enabled.load(std::memory_order_relaxed)) Py_RETURN_NONE;
  uint64_t cat, name, arg = 0;
  if (!arg_u64(args[0], &cat) || !arg_name(args[1], &name)) return nullptr;
  double v = PyFloat_AsDouble(args[2]);
  if (v == -1.0 && PyErr_Occurred()) return nullptr;
  const bool has_arg = nargs >= 4 && args[3] != Py_None;
  if (has_arg && !arg_u64(args[3], &arg)) return nullptr;
  uint64_t at = 0;
  if (nargs == 5 && args[4] != Py_None && !arg_u64(args[4], &at)) return nullptr;
  record_counter(uint8_t(cat & 15), uint32_t(name), v, arg, has_arg, at);
  Py_RETURN_NONE;
}

#define FASTCALL(f) reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(f))
PyMethodDef hot_methods[] = {
    {"annotate", FASTCALL(py_annotate), METH_FASTCALL,
     "annotate(name, category=0): a span as a context manager or decorator"},
    {"annotation_begin", FASTCALL(py_annotation_begin), METH_FASTCALL,
     "annotation_begin(name, category=0) -> handle"},
    {"annotation_end", FASTCALL(py_annotation_end), METH_FASTCALL, "annotation_end(handle)"},
    {"phase", FASTCALL(py_phase), METH_FASTCALL,
     "phase(name): a span of one of the canonical phases (GetNext, Forward, Loss, ...)"},
    {"now", py_now, METH_NOARGS, "the current time in ticks"},
    {"enabled", py_enabled, METH_NOARGS, "whether events are being recorded"},
    {"span", FASTCALL(py_span), METH_FASTCALL, "span(category, name_id, t0, t1=None, arg=None)"},
    {"instant", FASTCALL(py_instant), METH_FASTCALL, "instant(category, name_id, arg=None)"},
    {"counter", FASTCALL(py_counter), METH_FASTCALL, "counter(category, name_id, value, arg=None, at=None)"},
    {nullptr, nullptr, 0, nullptr}};

template <typename T>
nb::object to_numpy(std::vector<T>&& v) {
  auto* heap = new std::vector<T>(std::move(v));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  size_t shape[1] = {heap->size()};
  return nb::cast(nb::ndarray<nb::numpy, T, nb::ndim<1>>(heap->data(), 1, shape, owner));
}

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

int64_t stepscope::intern_pyname(PyObject* name) { return intern_obj(name); }

bool stepscope::check_name_id(uint64_t id) {
  if (is_interned(id)) return true;
  PyErr_Format(PyExc_ValueError, "name id %llu was never interned (use stepscope's intern(name))",
               (unsigned long long)id);
  return false;
}

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

  SpanType.tp_name = "stepscope.Span";
  SpanType.tp_basicsize = sizeof(SpanObject);
  SpanType.tp_flags = Py_TPFLAGS_DEFAULT;
  SpanType.tp_dealloc = span_dealloc;
  SpanType.tp_methods = span_methods;
  SpanType.tp_getset = span_getset;
  SpanType.tp_call = span_call;
  SpanType.tp_repr = span_repr;
  SpanType.tp_doc = "A named span: use it with `with`, or as a decorator.";
  if (PyType_Ready(&SpanType) < 0) throw nb::python_error();
  Py_INCREF(&SpanType);
  PyModule_AddObject(m.ptr(), "Span", reinterpret_cast<PyObject*>(&SpanType));
  g_name_cache = PyDict_New();
  if (!g_name_cache || PyModule_AddFunctions(m.ptr(), hot_methods) < 0) throw nb::python_error();
  if (PyModule_AddFunctions(m.ptr(), pysampler_methods()) < 0) throw nb::python_error();
  nb::list phases;
  for (const char* name : kPhaseNames) {
    nb::str s(name);
    if (intern_obj(s.ptr()) < 0) throw nb::python_error();
    phases.append(s);
  }
  m.attr("PHASES") = nb::tuple(phases);
  if (!add_step_tracker(m.ptr()) || !add_hooks(m.ptr()) || !add_around(m.ptr()) || !add_loop_state(m.ptr()) ||
      !add_roots(m.ptr()) ||
      !add_optimizer_hooks(m.ptr()) || !add_passes(m.ptr()))
    throw nb::python_error();
  if (!add_settings(m.ptr())) throw nb::python_error();

  m.attr("CATEGORIES") = nb::make_tuple("annotation", "phase", "step", "op", "module", "system",
                                        "gpu", "counter", "internal", "framework");
  m.attr("FORMAT_VERSION") = nb::make_tuple(kFormatMajor, kFormatMinor);
  m.attr("MAX_NAMES") = kMaxNames;
  m.attr("MAX_NAME_BYTES") = kMaxNameBytes;
  m.attr("OVERFLOW_NAME") = kOverflowName;

  m.def("intern", [](nb::handle name) {
    int64_t id = intern_obj(name.ptr());
    if (id < 0) throw nb::python_error();
    return uint32_t(id);
  }, "Interns a name and returns its id.");
  m.def("set_decorators", [](nb::object decorate, nb::object bare) {
    Py_XDECREF(g_decorate);
    Py_XDECREF(g_decorate_bare);
    g_decorate = decorate.release().ptr();
    g_decorate_bare = bare.release().ptr();
  });
  m.def("begin_step", [](nb::handle mode, uint64_t at) {
    int64_t id = intern_obj(mode.ptr());
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
