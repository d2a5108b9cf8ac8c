"""Keep stepscope's own sampling off the job's stderr.

Some libraries stepscope drives for short moments (TensorFlow's profiler
session) log from C++ straight to file descriptor 2. ``native_logs_dropped``
points descriptor 2 at a pipe for such a moment; a thread passes every line on
to the real stderr at once, except lines that match ``drop``. Output of the
job's own threads in that moment is forwarded unchanged and in order.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading


@contextlib.contextmanager
def native_logs_dropped(drop: "re.Pattern[bytes]"):
    try:
        sys.stderr.flush()
        saved = os.dup(2)
        read_end, write_end = os.pipe()
        os.dup2(write_end, 2)
        os.close(write_end)
    except (OSError, ValueError, AttributeError):  # no usable fd 2: nothing to keep clean
        yield
        return
    pump = threading.Thread(target=_pump, args=(read_end, saved, drop), name="stepscope-stderr", daemon=True)
    pump.start()
    try:
        yield
    finally:
        try:
            sys.stderr.flush()
        except (OSError, ValueError, AttributeError):
            pass
        os.dup2(saved, 2)  # the pipe's last writer goes: the pump sees its end
        pump.join(timeout=5)
        if not pump.is_alive():  # else a forked child still holds the pipe: the pump keeps `saved`
            os.close(saved)


def _pump(read_end: int, out: int, drop) -> None:
    with os.fdopen(read_end, "rb", buffering=0) as pipe:
        pending = b""
        while True:
            chunk = pipe.read(65536)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if not drop.search(line):
                    _write_all(out, line + b"\n")
        if pending and not drop.search(pending):
            _write_all(out, pending)


def _write_all(fd: int, data: bytes) -> None:
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        pass
