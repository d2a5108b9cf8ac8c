// The StepTracker Python type: its attributes (typed, never null: the reports rely
// on it), construction, the garbage collector's hooks, and add_step_tracker.
//
// State that Python reads or sets (the integrations, the operator windows) is
// exposed as attributes with the names and shapes the Python tracker had.
#include "steps/steps.h"
#include "steps/tracker.h"

#include <structmember.h>  // after Python.h

namespace stepscope {
namespace machine {
namespace {

#define MEMBER(name, type, field) {name, type, offsetof(Tracker, field), 0, nullptr}
PyMemberDef members[] = {
    MEMBER("background", T_BOOL, background),
    MEMBER("every_step", T_BOOL, every_step),
    MEMBER("worked", T_BOOL, worked),
    MEMBER("suspended", T_BOOL, suspended),
    MEMBER("done", T_BOOL, done),
    MEMBER("fed", T_BOOL, fed),
    MEMBER("optimizer_seen", T_BOOL, opt_used),
    {"trained", T_BOOL, offsetof(Tracker, finished), READONLY, "a train step of this thread completed"},
    MEMBER("last_end", T_ULONGLONG, last_end),
    MEMBER("forwards_in_step", T_LONG, forwards_in_step),
    MEMBER("prefetched", T_ULONG, prefetched),
    {nullptr, 0, 0, 0, nullptr}};

PyObject* get_mode(PyObject* self, void*) { return new_ref(T(self)->mode); }

PyObject* get_pending(PyObject* self, void*) {
  Tracker* t = T(self);
  if (!t->pending_mode) Py_RETURN_NONE;
  return Py_BuildValue("(KKO)", t->pending_t0, t->pending_t1, t->pending_mode);
}

int set_pending(PyObject* self, PyObject* v, void*) {  // None, or (t0, t1, mode)
  Tracker* t = T(self);
  if (!v || v == Py_None) {
    Py_CLEAR(t->pending_mode);
    return 0;
  }
  unsigned long long t0, t1;
  if (!PyTuple_Check(v) || PyTuple_GET_SIZE(v) != 3 || !arg_u64(PyTuple_GET_ITEM(v, 0), &t0) ||
      !arg_u64(PyTuple_GET_ITEM(v, 1), &t1)) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "pending is None or (t0, t1, mode)");
    return -1;
  }
  t->pending_t0 = t0;
  t->pending_t1 = t1;
  put(&t->pending_mode, PyTuple_GET_ITEM(v, 2));
  return 0;
}

PyObject* pair_or_none(PyObject* mode, unsigned long long at, bool mode_first) {
  if (!mode) Py_RETURN_NONE;
  return mode_first ? Py_BuildValue("(OK)", mode, at) : Py_BuildValue("(KO)", at, mode);
}
PyObject* get_mark(PyObject* self, void*) { return pair_or_none(T(self)->mark_mode, T(self)->mark_at, true); }
PyObject* get_candidate(PyObject* self, void*) { return pair_or_none(T(self)->cand_mode, T(self)->cand_at, false); }

PyObject* get_forward_end(PyObject* self, void*) {
  Tracker* t = T(self);
  if (!t->has_forward_end) Py_RETURN_NONE;
  return PyLong_FromUnsignedLongLong(t->forward_end);
}

// The type checks as functions (the C API's are macros).
int is_list(PyObject* o) { return PyList_Check(o); }
int is_set(PyObject* o) { return PySet_Check(o); }

// The object attributes Python may set: typed, never null (the reports rely on it).
// A callback is a callable or None; deleting it sets None. The sets and the list
// take a set (a list) and are never deleted.
template <size_t Offset>
PyObject*& slot_of(PyObject* self) {
  return *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(self) + Offset);
}

template <size_t Offset>
PyObject* get_slot(PyObject* self, void*) {
  return new_ref(slot_of<Offset>(self));
}

template <size_t Offset>
int set_callback(PyObject* self, PyObject* v, void* name) {
  if (!v) v = Py_None;
  if (v != Py_None && !PyCallable_Check(v)) {
    PyErr_Format(PyExc_TypeError, "StepTracker.%s is a callable or None, not %.100s", static_cast<const char*>(name),
                 Py_TYPE(v)->tp_name);
    return -1;
  }
  put(&slot_of<Offset>(self), v);
  return 0;
}

template <size_t Offset, int (*Check)(PyObject*)>
int set_container(PyObject* self, PyObject* v, void* name) {
  const char* kind = Check == is_list ? "list" : "set";
  if (!v) {
    PyErr_Format(PyExc_AttributeError, "StepTracker.%s cannot be deleted", static_cast<const char*>(name));
    return -1;
  }
  if (!Check(v)) {
    PyErr_Format(PyExc_TypeError, "StepTracker.%s is a %s, not %.100s", static_cast<const char*>(name), kind,
                 Py_TYPE(v)->tp_name);
    return -1;
  }
  put(&slot_of<Offset>(self), v);
  return 0;
}

#define CALLBACK(name, field, doc) \
  {name, get_slot<offsetof(Tracker, field)>, set_callback<offsetof(Tracker, field)>, doc, const_cast<char*>(name)}
#define CONTAINER(name, field, check, doc)                                                              \
  {name, get_slot<offsetof(Tracker, field)>, set_container<offsetof(Tracker, field), check>, doc, \
   const_cast<char*>(name)}

PyGetSetDef getset[] = {
    CALLBACK("on_new_step", on_new_step, "on_new_step(previous_had_forward), or None"),
    CALLBACK("may_begin", may_begin, "may_begin() -> False where this process runs no loop, or None"),
    CALLBACK("guess", guess, "guess() -> the mode of a fetch whose work never showed, or None (train)"),
    CONTAINER("pending_more", pending_more, is_list, "(t0, t1) of fetches read ahead with the held-back one"),
    CONTAINER("optimizers_in_step", opt_in_step, is_set, "keys of the optimizers that stepped in this step"),
    CONTAINER("optimizers_before", opt_before, is_set, "keys of the optimizers that stepped in the step before"),
    CONTAINER("optimizers_known", opt_known, is_set, "keys of the optimizers this process made"),
    {"mode", get_mode, nullptr, "mode of the open step; None between loops", nullptr},
    {"pending", get_pending, set_pending, "(t0, t1, mode) of a held-back fetch, or None", nullptr},
    {"mark", get_mark, nullptr, "(mode, at): an eval step's mark, not yet written", nullptr},
    {"candidate", get_candidate, nullptr, "(at, mode): a possible step start, several optimizers", nullptr},
    {"forward_end", get_forward_end, nullptr, "a train forward ended and no loss was seen since", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

// Every slot set before __init__ (which a subclass may skip, or `StepTracker.__new__`):
// the reports and the attributes read them without checking.
PyObject* tp_new(PyTypeObject* type, PyObject*, PyObject*) {
  PyObject* self = type->tp_alloc(type, 0);
  if (!self) return nullptr;
  Tracker* t = T(self);
  for (PyObject** callback : {&t->on_new_step, &t->may_begin, &t->guess}) *callback = new_ref(Py_None);
  t->every_step = 1;
  if (!reset(t)) Py_CLEAR(self);
  return self;
}

int tp_init(PyObject* self, PyObject* args, PyObject* kwargs) {
  static const char* kw[] = {"on_new_step", "may_begin", nullptr};
  PyObject *on_new_step = Py_None, *may_begin = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OO:StepTracker", const_cast<char**>(kw), &on_new_step,
                                   &may_begin))
    return -1;
  Tracker* t = T(self);
  if (set_callback<offsetof(Tracker, on_new_step)>(self, on_new_step, const_cast<char*>("on_new_step")) < 0 ||
      set_callback<offsetof(Tracker, may_begin)>(self, may_begin, const_cast<char*>("may_begin")) < 0)
    return -1;
  put(&t->guess, Py_None);
  t->background = t->worked = t->opt_used = 0;
  t->every_step = 1;
  return reset(t) ? 0 : -1;
}

int tp_traverse(PyObject* self, visitproc visit, void* arg) {
  Tracker* t = T(self);
  for (PyObject* o : {t->on_new_step, t->may_begin, t->guess, t->mode, t->pending_mode, t->pending_more, t->mark_mode,
                      t->cand_mode, t->opt_in_step, t->opt_before, t->opt_known, t->held_group, t->held_mode})
    Py_VISIT(o);
  return 0;
}

// Replaces a container slot by a new empty one (kept where none can be made).
void replace_empty(PyObject** slot, PyObject* empty) {
  if (empty) Py_XSETREF(*slot, empty);
  else PyErr_Clear();
}

// Breaks cycles, leaving a tracker whose reports still run: the callbacks and the mode
// None, the sets and the list new and empty (code that runs while a cycle is collected
// may still reach it; a container someone else holds is left as it is).
int tp_clear(PyObject* self) {
  Tracker* t = T(self);
  for (PyObject** o : {&t->pending_mode, &t->mark_mode, &t->cand_mode, &t->held_group, &t->held_mode}) Py_CLEAR(*o);
  for (PyObject** o : {&t->on_new_step, &t->may_begin, &t->guess, &t->mode}) put(o, Py_None);
  for (PyObject** set : {&t->opt_in_step, &t->opt_before, &t->opt_known}) replace_empty(set, PySet_New(nullptr));
  replace_empty(&t->pending_more, PyList_New(0));
  return 0;
}

void tp_dealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  Tracker* t = T(self);
  for (PyObject** o : {&t->on_new_step, &t->may_begin, &t->guess, &t->mode, &t->pending_mode, &t->pending_more,
                       &t->mark_mode, &t->cand_mode, &t->opt_in_step, &t->opt_before, &t->opt_known, &t->held_group,
                       &t->held_mode})
    Py_CLEAR(*o);
  type->tp_free(self);
}

}  // namespace

PyTypeObject TrackerType = {PyVarObject_HEAD_INIT(nullptr, 0)};

}  // namespace machine

using namespace machine;

bool add_step_tracker(PyObject* module) {
  g_train = PyUnicode_InternFromString("train");
  g_eval = PyUnicode_InternFromString("eval");
  g_ops_due = PyUnicode_InternFromString("ops_due");
  g_ops_step = PyUnicode_InternFromString("ops_step");
  g_by_hand = PyUnicode_InternFromString("by_hand");
  if (!g_train || !g_eval || !g_ops_due || !g_ops_step || !g_by_hand) return false;
  TrackerType.tp_name = "stepscope.core._native.StepTracker";
  TrackerType.tp_basicsize = sizeof(Tracker);
  TrackerType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC;
  TrackerType.tp_new = tp_new;
  TrackerType.tp_init = tp_init;
  TrackerType.tp_dealloc = tp_dealloc;
  TrackerType.tp_traverse = tp_traverse;
  TrackerType.tp_clear = tp_clear;
  TrackerType.tp_methods = tracker_methods;
  TrackerType.tp_members = members;
  TrackerType.tp_getset = getset;
  TrackerType.tp_doc = "From phase reports to contiguous steps (integrations/_steps.py).";
  if (PyType_Ready(&TrackerType) < 0) return false;
  Py_INCREF(&TrackerType);
  return PyModule_AddObject(module, "StepTracker", reinterpret_cast<PyObject*>(&TrackerType)) == 0;
}

}  // namespace stepscope
