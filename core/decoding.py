"""The native decoder, for readers of a run (``stepscope.analysis``, tools).

Readers reach the compiled core only through these names (the recording side
uses ``stepscope.core.recording``).

``read_trace(path, part=0, parts=1, part_bytes=0, events=True, gpu=True)``
    Decodes one ``trace.bin`` (docs/format.md) into a dict of NumPy columns
    and notes (``warnings``; ``valid_end``: the offset after the last
    complete chunk). ``parts`` > 1 decodes the ``part``-th group of its
    chunks, ``part_bytes`` > 0 the chunks that start in the ``part``-th
    ``part_bytes`` of the file (chunks are independent: readers decode one
    file on several threads); ``events``/``gpu`` False leave those chunks
    undecoded. A damaged chunk is skipped and named in ``warnings``; a file
    that cannot be read raises ``OSError``/``ValueError`` naming it.
``step_phases(kind, category, name, tid, start, end, arg, phase_of_name, op_window_name, ...codes)``
    One process's steps and phases from its events' columns in start order
    (csrc/aggregate/step_phases.h; analysis/tables/step_pass.py calls it).
``kernel_steps(process, device, start, end, step, mode, phase, duration, launched, latency, ...)``
    Compute kernels aggregated per step and per phase (csrc/aggregate/kernel_steps.h;
    analysis/tables/kernel_steps.py calls it).
``innermost_segments(start, end)`` / ``attribute(start, end, values, times)``
    A process's phase spans as the segments naming the innermost span, and the
    value of the interval each time falls in (csrc/aggregate/attribution.h;
    analysis/tables/gpu.py's Timeline calls them).
``demangle(names)``
    C++ symbol names (kernels) as people read them; names that are not
    mangled come back unchanged.
"""

from __future__ import annotations

from stepscope.core import _native

read_trace = _native.read_trace
demangle = _native.demangle
step_phases = _native.step_phases
kernel_steps = _native.kernel_steps
innermost_segments = _native.innermost_segments
attribute = _native.attribute
FORMAT_VERSION = _native.FORMAT_VERSION

__all__ = ["FORMAT_VERSION", "attribute", "demangle", "innermost_segments", "kernel_steps", "read_trace",
           "step_phases"]
