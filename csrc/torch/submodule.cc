// stepscope.core._native.torch: the one framework-specific part of the native module
// kept apart from the framework-free core, so that the core's namespace names no
// framework. Its one Python caller is integrations/torch/_native_hooks.py. The
// constructors (run at set-up) take named arguments; the calls made on every step
// (optimizer_began/done, loop_state) stay positional (METH_FASTCALL, METH_O).
#include "torch/submodule.h"

#include "torch/hooks.h"
#include "torch/loop.h"
#include "torch/optimizer_hooks.h"
#include "torch/passes.h"
#include "torch/roots.h"

namespace stepscope {

bool add_torch_submodule(PyObject* parent) {
  PyObject* sub = PyModule_New("stepscope.core._native.torch");
  if (!sub) return false;
  if (PyModule_SetDocString(sub, "The PyTorch integration's native types (csrc/torch/).") < 0 ||
      !add_loop_state(sub) || !add_hooks(sub) || !add_roots(sub) || !add_optimizer_hooks(sub) || !add_passes(sub)) {
    Py_DECREF(sub);
    return false;
  }
  return PyModule_AddObject(parent, "torch", sub) == 0 || (Py_DECREF(sub), false);
}

}  // namespace stepscope
