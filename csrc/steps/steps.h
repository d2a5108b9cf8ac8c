// The step tracker (tracker.h and its files: machine.cc, fetches.cc, reports.cc,
// methods.cc, pytype.cc): from phase callbacks to contiguous steps.
#pragma once

#include <Python.h>

#include <cstdint>

namespace stepscope {

// Interns a Python str (module.cc's cache); -1 with a Python error set.
int64_t intern_pyname(PyObject* name);
// Whether `id` is a name id intern() handed out; else false with a ValueError set.
bool check_name_id(uint64_t id);

// Adds the StepTracker type to the module; false with a Python error set.
bool add_step_tracker(PyObject* module);

// Whether `tracker` is a StepTracker whose type leaves the reports below as they
// are: then the native hooks call them directly, without boxing the ticks or
// looking the method up. A subclass or a patch that replaces a report (tests
// inject failures so) is told through its methods. Cached by type and version
// tag (a patch on the class changes the tag); the hit is inline in the caller.
namespace reports {
extern PyTypeObject* g_native_type;  // the type whose reports were last found native
extern unsigned int g_native_tag;    // at this version tag (0: none)
bool look(PyObject* tracker);        // the miss
}  // namespace reports

// A type's version tag while valid, else 0. Since 3.11 a change to the type zeroes the
// tag; before, it only clears the VALID flag (and the next lookup assigns a new tag).
inline unsigned int version_tag(PyTypeObject* type) {
#if PY_VERSION_HEX < 0x030B0000
  if (!PyType_HasFeature(type, Py_TPFLAGS_VALID_VERSION_TAG)) return 0;
#endif
  return type->tp_version_tag;
}

inline bool native_reports(PyObject* tracker) {
  PyTypeObject* type = Py_TYPE(tracker);
  if (type == reports::g_native_type && reports::g_native_tag && version_tag(type) == reports::g_native_tag)
    return true;
  return reports::look(tracker);
}

// The tracker's reports, typed: what its Python methods of the same names do
// (integrations/_steps.py documents them). False with a Python error set.
namespace track {
bool fetched(PyObject* tracker, unsigned long long t0, unsigned long long t1, PyObject* mode);
bool exhausted(PyObject* tracker, unsigned long long t0, unsigned long long t1);
// group: parts of one forward the program called directly (their Forward is one span), or
// null; part: which (a root's identity): the first part starting again is the next forward
// acting: an eval forward only because grad is off, its model in training mode (an RL
// agent choosing actions between its updates: see phase_start)
bool forward_started(PyObject* tracker, PyObject* mode, unsigned long long now, PyObject* group = nullptr,
                     PyObject* part = nullptr, bool acting = false);
bool forward_ended(PyObject* tracker, PyObject* mode, unsigned long long t0, unsigned long long t1, uint32_t phase,
                   PyObject* group = nullptr, PyObject* part = nullptr);
bool loss(PyObject* tracker, unsigned long long t0, unsigned long long t1);
bool backward_started(PyObject* tracker, unsigned long long now, bool begins_step);
bool backward_ended(PyObject* tracker, unsigned long long t0, unsigned long long t1);
bool optimizer_used(PyObject* tracker);
bool optimizer_started(PyObject* tracker, PyObject* key, unsigned long long now);
bool optimizer_ended(PyObject* tracker, PyObject* key, unsigned long long t0, unsigned long long t1);
bool loop_started(PyObject* tracker);  // a new pass over a loader begins
}  // namespace track

}  // namespace stepscope
