"""The PyTorch integration's native types (``stepscope.core._native.torch``,
``csrc/torch/``): this file is their one caller, and the only file of the
integration that touches the native module. Everything else records through
``stepscope.core.recording``.

The constructors run at set-up (a root adopted, a function patched) and are
called with named arguments. The calls made on every step (``loop_state``,
``optimizer_began``, ``optimizer_done``) are the native functions themselves,
positional: a Python frame or keyword parsing there would cost every step.
"""

from __future__ import annotations

from stepscope.core._native import torch as _torch

# One thread's place in its loop (csrc/torch/loop.h): depth, in_backward, in_optimizer,
# stack, forced_modes, iter_started, setting_mode, pending_root, tracker (and the
# native-only optimizer_t0, fetch_t0, zero_grad_t0, optimizer_ranges).
LoopState = _torch.LoopState

# --- on every step: the native functions, positional -------------------------------------
loop_state = _torch.loop_state  # (local) -> the calling thread's local.s, cached per OS thread
optimizer_began = _torch.optimizer_began  # (local, key) -> whether torch's Optimizer.step# range was open
optimizer_done = _torch.optimizer_done  # (local, key)
loop_states_changed = _torch.loop_states_changed  # () a thread's state was replaced (a forked child)


# --- at set-up: called with named arguments (see each one's docstring for them) ----------
timed_root = _torch.timed_root  # a root module's timed call: its _compiled_call_impl slot (roots.cc)
timed_iter = _torch.timed_iter  # DataLoader.__iter__ marking a pass's start (passes.cc)
timed_backward = _torch.timed_backward  # the engine call of every backward (hooks.cc)
filtered_enter = _torch.filtered_enter  # record_function.__enter__ (hooks.cc)
guarded_exit = _torch.guarded_exit  # record_function.__exit__ (hooks.cc)
optimizer_hook = _torch.optimizer_hook  # a global optimizer step pre- or post-hook (optimizer_hooks.cc)
