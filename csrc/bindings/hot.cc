// The hottest calls of the product as CPython methods (METH_FASTCALL, no nanobind):
// annotate's Span object, phase, span, instant, counter, now. Each reads the clock
// and appends a fixed-size record to the calling thread's buffer; a name is
// interned through a str -> id dict without leaving C.
#include "bindings/hot.h"

#include "common/pyint.h"
#include "record/recorder.h"
#include "steps/steps.h"

namespace stepscope {
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

// span_counted(category, name_id, t0, arg, value) -> t1: a span from t0 to now and a counter
// of the same name and arg at t0, in one call; returns now. A collective's call and its bytes
// (integrations/torch/_collectives.py): one call instead of now(), span() and counter().
PyObject* py_span_counted(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 5) {
    PyErr_SetString(PyExc_TypeError, "span_counted(category, name_id, t0, arg, value)");
    return nullptr;
  }
  const uint64_t t1 = ticks();
  if (g_enabled.load(std::memory_order_relaxed)) {
    uint64_t cat, name, t0, arg;
    if (!arg_u64(args[0], &cat) || !arg_name(args[1], &name) || !arg_u64(args[2], &t0) ||
        !arg_u64(args[3], &arg))
      return nullptr;
    const double v = PyFloat_AsDouble(args[4]);
    if (v == -1.0 && PyErr_Occurred()) return nullptr;
    record_span(uint8_t(cat & 15), uint32_t(name), t0, t1, arg, true);
    record_counter(uint8_t(cat & 15), uint32_t(name), v, arg, true, t0);
  }
  return PyLong_FromUnsignedLongLong(t1);
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
    {"span_counted", FASTCALL(py_span_counted), METH_FASTCALL,
     "span_counted(category, name_id, t0, arg, value) -> t1: a span to now and a counter at t0"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

int64_t bindings::intern_obj(PyObject* name) { return ::stepscope::intern_obj(name); }

void bindings::set_decorators(PyObject* decorate, PyObject* bare) {
  Py_XSETREF(g_decorate, decorate);
  Py_XSETREF(g_decorate_bare, bare);
}

bool bindings::add_hot(PyObject* m) {
  SpanType.tp_name = "stepscope.Span";
  SpanType.tp_basicsize = sizeof(SpanObject);
  SpanType.tp_flags = Py_TPFLAGS_DEFAULT;
  SpanType.tp_dealloc = span_dealloc;
  SpanType.tp_methods = span_methods;
  SpanType.tp_getset = span_getset;
  SpanType.tp_call = span_call;
  SpanType.tp_repr = span_repr;
  SpanType.tp_doc = "A named span: use it with `with`, or as a decorator.";
  if (PyType_Ready(&SpanType) < 0) return false;
  Py_INCREF(&SpanType);
  PyModule_AddObject(m, "Span", reinterpret_cast<PyObject*>(&SpanType));
  g_name_cache = PyDict_New();
  if (!g_name_cache || PyModule_AddFunctions(m, hot_methods) < 0) return false;
  // the phase names are interned first: their ids are 0..5 (py_phase, steps/tracker.h)
  PyObject* phases = PyTuple_New(kNumPhases);
  if (!phases) return false;
  for (uint32_t i = 0; i < kNumPhases; ++i) {
    PyObject* name = PyUnicode_FromString(kPhaseNames[i]);
    if (!name || intern_obj(name) < 0) {
      Py_XDECREF(name);
      Py_DECREF(phases);
      return false;
    }
    PyTuple_SET_ITEM(phases, i, name);
  }
  return PyModule_AddObject(m, "PHASES", phases) == 0 || (Py_DECREF(phases), false);
}

int64_t intern_pyname(PyObject* name) { return intern_obj(name); }

bool check_name_id(uint64_t id) {
  if (is_interned(id)) return true;
  PyErr_Format(PyExc_ValueError, "name id %llu was never interned (use stepscope's intern(name))",
               (unsigned long long)id);
  return false;
}


}  // namespace stepscope
