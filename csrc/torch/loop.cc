// The LoopState type (loop.h).
#include "torch/loop.h"

#include <structmember.h>

#include "common/clock.h"
#include "torch/tell.h"

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace stepscope {

PyTypeObject LoopStateType = {PyVarObject_HEAD_INIT(nullptr, 0)};

namespace {

PyObject* g_s;

LoopState* L(PyObject* o) { return reinterpret_cast<LoopState*>(o); }

PyObject** object_fields(PyObject* self, int i) {
  LoopState* s = L(self);
  PyObject** fields[] = {&s->stack,        &s->forced_modes, &s->iter_started, &s->setting_mode,
                         &s->pending_root, &s->tracker,      &s->optimizer_key};
  return i < int(sizeof(fields) / sizeof(fields[0])) ? fields[i] : nullptr;
}

int tp_init(PyObject* self, PyObject* args, PyObject* kwargs) {
  static const char* names[] = {"tracker", nullptr};
  PyObject* tracker;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O:LoopState", const_cast<char**>(names), &tracker)) return -1;
  LoopState* s = L(self);
  PyObject* stack = PyList_New(0);
  PyObject* forced = PyList_New(0);
  if (!stack || !forced) {
    Py_XDECREF(stack);
    Py_XDECREF(forced);
    return -1;
  }
  PyObject* values[] = {stack, forced, Py_None, Py_False, Py_None, tracker, Py_None};
  for (int i = 0; PyObject** field = object_fields(self, i); ++i) {
    Py_INCREF(values[i]);
    Py_XSETREF(*field, values[i]);
  }
  Py_DECREF(stack);
  Py_DECREF(forced);
  s->depth = s->in_backward = s->in_optimizer = 0;
  s->optimizer_t0 = s->fetch_t0 = s->zero_grad_t0 = 0;
  s->optimizer_ranges = s->ranges_began = s->optimizer_range_t0 = 0;
  s->range_entered = nullptr;
  s->range_route = 0;
  return 0;
}

int tp_traverse(PyObject* self, visitproc visit, void* arg) { return visit_fields(self, object_fields, visit, arg); }

int tp_clear(PyObject* self) { return clear_fields(self, object_fields); }

void tp_dealloc(PyObject* self) {
  PyObject_GC_UnTrack(self);
  tp_clear(self);
  Py_TYPE(self)->tp_free(self);
}

#define OBJ(field, doc) {#field, T_OBJECT_EX, offsetof(LoopState, field), 0, doc}
PyMemberDef members[] = {
    {"depth", T_LONG, offsetof(LoopState, depth), 0, "root forwards (or a fetch) in progress: nested work is theirs"},
    {"in_backward", T_LONG, offsetof(LoopState, in_backward), 0, "a backward in progress: forwards inside it are Recompute"},
    {"in_optimizer", T_LONG, offsetof(LoopState, in_optimizer), 0, "optimizer steps in progress"},
    OBJ(stack, "(t0, mode, phase, part) of open root forwards (part: (group, root) or None)"),
    OBJ(forced_modes, "modes a framework loop set (Keras fit/evaluate/predict)"),
    OBJ(iter_started, "tick: DataLoader.__iter__ began, no fetch since; None"),
    OBJ(setting_mode, "inside Module.train()"),
    OBJ(pending_root, "a module whose first call the discovery post-hook times"),
    OBJ(tracker, "the thread's step tracker"),
    {"optimizer_t0", T_ULONGLONG, offsetof(LoopState, optimizer_t0), READONLY, "tick: the optimizer step began"},
    {"fetch_t0", T_ULONGLONG, offsetof(LoopState, fetch_t0), READONLY, "tick: the outermost fetch began"},
    {"zero_grad_t0", T_ULONGLONG, offsetof(LoopState, zero_grad_t0), READONLY, "tick: a zero_grad began"},
    {"optimizer_ranges", T_ULONGLONG, offsetof(LoopState, optimizer_ranges), READONLY,
     "torch's Optimizer.step# ranges open"},
    {nullptr, 0, 0, 0, nullptr}};
#undef OBJ

PyObject* py_loop_state(PyObject*, PyObject* local) { return reinterpret_cast<PyObject*>(loop_state_of(local)); }

PyObject* py_loop_states_changed(PyObject*, PyObject*) {
  loop_states_changed();
  Py_RETURN_NONE;
}

PyObject* py_optimizer_began(PyObject*, PyObject* const* a, Py_ssize_t n) {
  if (n != 2) {
    PyErr_SetString(PyExc_TypeError, "optimizer_began(local, key)");
    return nullptr;
  }
  bool in_range = true;
  if (!optimizer_began(a[0], a[1], &in_range)) return nullptr;
  return PyBool_FromLong(in_range);
}

PyObject* py_optimizer_done(PyObject*, PyObject* const* a, Py_ssize_t n) {
  if (n != 2) {
    PyErr_SetString(PyExc_TypeError, "optimizer_done(local, key)");
    return nullptr;
  }
  if (!optimizer_done(a[0], a[1])) return nullptr;
  Py_RETURN_NONE;
}

#define FAST(f) reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(f)), METH_FASTCALL
PyMethodDef functions[] = {
    {"optimizer_began", FAST(py_optimizer_began),
     "optimizer_began(local, key): an optimizer step's pre-hook, on the thread's loop state; whether "
     "torch's Optimizer.step# range was open (its exit ends the step: else only a post-hook can)"},
    {"optimizer_done", FAST(py_optimizer_done),
     "optimizer_done(local, key): an optimizer step's post-hook, on the thread's loop state"},
    {"loop_state", py_loop_state, METH_O, "loop_state(local): the calling thread's local.s, cached (csrc/torch/loop.h)"},
    {"loop_states_changed", py_loop_states_changed, METH_NOARGS,
     "A thread's loop state was replaced (a forked child's reset): forget the cached ones."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

namespace loop_cache {

// This thread's last answer. Strong references: neither object can be freed
// and its address reused while cached (at thread exit they stay alive, as the
// integration's list of every thread's state keeps them anyway).
__thread Cached t_cached __attribute__((tls_model("initial-exec")));
std::atomic<uint64_t> g_epoch{1};

LoopState* lookup(PyObject* local) {
  Cached& c = t_cached;
  uint64_t epoch = g_epoch.load(std::memory_order_acquire);
  PyObject* st = PyObject_GetAttr(local, g_s);
  if (st && !is_loop_state(st)) {
    PyErr_Format(PyExc_TypeError, "the loop state is a %.100s, not a LoopState", Py_TYPE(st)->tp_name);
    Py_CLEAR(st);
  }
  if (!st) return nullptr;
  PyObject *old_local = c.local, *old_state = c.state;
  Py_INCREF(local);
  Py_INCREF(st);
  c = Cached{local, st, epoch};
  Py_XDECREF(old_local);  // after the cache is whole: a deallocation may run hooks
  Py_XDECREF(old_state);
  return L(st);
}

}  // namespace loop_cache

namespace export_flag {

PyObject* g_name;

int read(PyObject* compiler) {
  PyObject* dict = PyModule_Check(compiler) ? PyModule_GetDict(compiler) : nullptr;
  PyObject* flag = dict ? PyDict_GetItemWithError(dict, g_name) : nullptr;  // borrowed
  if (flag == Py_False) return 0;
  if (flag == Py_True) return 1;
  if (PyErr_Occurred()) return -1;
  flag = PyObject_GetAttr(compiler, g_name);  // not a module, or not in its dict
  int on = flag ? PyObject_IsTrue(flag) : -1;
  Py_XDECREF(flag);
  return on;
}

}  // namespace export_flag

namespace {
constexpr unsigned long long kMaxRangeLevel = 63;
unsigned long long level_bit(unsigned long long level) { return level <= kMaxRangeLevel ? 1ull << level : 0; }
}  // namespace

bool optimizer_began(PyObject* local, PyObject* key, bool* in_range) {
  LoopState* st = loop_state_of(local);
  if (!st) return false;
  const unsigned long long bit = level_bit(st->optimizer_ranges);
  if (in_range) *in_range = st->optimizer_ranges > 0 && bit;
  const long depth = ++st->in_optimizer;
  bool ok = true;
  if (st->optimizer_ranges) st->ranges_began |= bit;
  if (depth == 1) {
    Py_INCREF(key);
    Py_XSETREF(st->optimizer_key, key);
    // inside torch's range: the step began where the range was entered
    st->optimizer_t0 = (st->optimizer_ranges && bit && st->optimizer_range_t0) ? st->optimizer_range_t0 : ticks();
    ok = tell::optimizer_started(st, key, st->optimizer_t0);
  }
  Py_DECREF(st);
  return ok;
}

bool optimizer_done(PyObject* local, PyObject* key) {
  LoopState* st = loop_state_of(local);
  if (!st) return false;
  bool ok = true;
  if (!(st->optimizer_ranges && (st->ranges_began & level_bit(st->optimizer_ranges)))) {  // else its range ends it
    if (--st->in_optimizer == 0) {
      Py_INCREF(Py_None);
      Py_XSETREF(st->optimizer_key, Py_None);
      ok = tell::optimizer_ended(st, key, st->optimizer_t0, ticks());
    }
  }
  Py_DECREF(st);
  return ok;
}

void optimizer_range_entered(LoopState* st, unsigned long long t0) {
  ++st->optimizer_ranges;
  st->optimizer_range_t0 = t0;
}

bool optimizer_range_exited(LoopState* st, unsigned long long t1) {
  if (!st->optimizer_ranges) return true;  // entered before a forked child's reset
  const unsigned long long bit = level_bit(st->optimizer_ranges--);
  if (!(st->ranges_began & bit)) return true;  // a step no pre-hook of ours began (or a filtered optimizer)
  st->ranges_began &= ~bit;
  if (--st->in_optimizer != 0) return true;
  PyObject* key = st->optimizer_key;  // owned from here
  st->optimizer_key = Py_None;
  Py_INCREF(Py_None);
  bool ok = tell::optimizer_ended(st, key ? key : Py_None, st->optimizer_t0, t1);
  Py_XDECREF(key);
  return ok;
}

void loop_states_changed() { loop_cache::g_epoch.fetch_add(1, std::memory_order_acq_rel); }

bool add_loop_state(PyObject* module) {
  g_s = PyUnicode_InternFromString("s");
  export_flag::g_name = PyUnicode_InternFromString("_is_compiling_flag");
  if (!g_s || !export_flag::g_name || !tell::init()) return false;
  LoopStateType.tp_name = "stepscope.core._native.torch.LoopState";
  LoopStateType.tp_basicsize = sizeof(LoopState);
  LoopStateType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;
  LoopStateType.tp_new = PyType_GenericNew;
  LoopStateType.tp_init = tp_init;
  LoopStateType.tp_dealloc = tp_dealloc;
  LoopStateType.tp_traverse = tp_traverse;
  LoopStateType.tp_clear = tp_clear;
  LoopStateType.tp_members = members;
  LoopStateType.tp_doc = "LoopState(tracker): one thread's place in its training loop (csrc/torch/loop.h).";
  if (PyType_Ready(&LoopStateType) < 0) return false;
  Py_INCREF(&LoopStateType);
  if (PyModule_AddObject(module, "LoopState", reinterpret_cast<PyObject*>(&LoopStateType)) < 0) return false;
  return PyModule_AddFunctions(module, functions) == 0;
}

}  // namespace stepscope
