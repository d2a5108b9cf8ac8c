"""Clock offsets between hosts, measured once a process group exists.

Why not a barrier or an all-reduce of timestamps: a collective added to the
user's job runs on the user's communicator (an NCCL stream, a gloo pair) and
can hang or reorder the job when ranks disagree about it. Instead every rank
talks to the rendezvous store that ``init_process_group`` just used (a
TCPStore that every rank can reach by construction), through its own cloned
connection, in a daemon thread: nothing here ever blocks the caller or touches
the user's communicator, and every wait has a short timeout.

Protocol (Cristian's algorithm through the store): global rank 0 is the
reference. It publishes its host and serves pings in ticket order, answering
each with its wall clock as the reader will compute it (``CLOCK_MONOTONIC`` +
its session's anchor offset). A rank on another host takes a ticket, reads
its monotonic clock (t0), sets ``ping/<ticket>``, waits for ``pong/<ticket>``
and reads its clock again (t1): the reference's answer belongs near the
midpoint, within ``(t1 - t0) / 2``. ``PINGS`` samples are kept; the merge uses
the one with the shortest round trip. Everything lands in ``clock.json`` in the
process folder (docs/design.md, "Many nodes").

At exit the thread must not be inside a store call: a daemon thread that returns
from a C++ call (which released the GIL) while the interpreter finalizes is ended
by ``pthread_exit``, whose unwinding through pybind's frames calls
``std::terminate`` (the job aborts with "terminate called without an active
exception"). A short job exits while the exchange still waits, so an ``atexit``
hook wakes the thread through a connection of its own (the key it waits for) and
joins it.
"""

from __future__ import annotations

import atexit
import datetime
import json
import os
import threading
import time

from stepscope.core import runinfo
from stepscope.core.vocabulary import CLOCK_JSON, PROCESS_JSON

PINGS = 16
PREFIX = "stepscope-clock"
WAIT_S = 30.0      # a rank waits this long for rank 0 to announce itself, and for each answer
SERVE_S = 3600.0   # rank 0 waits this long for a ping before giving up (a rank without stepscope)
STOP = b"stop"

_generation = [0]  # one exchange per init_process_group; every rank counts the same
_active = []  # (thread, waker store, state) of the exchanges started: finished at exit
JOIN_S = 2.0  # at exit, how long the thread is given once woken


def start(dist, rank: int, world_size: int) -> None:
    """Starts the exchange in a daemon thread; never raises, never blocks."""
    from stepscope.core import session

    s = session.current()
    if s is None or world_size is None or world_size < 2:
        return
    try:
        from torch.distributed import distributed_c10d

        base = distributed_c10d._get_default_store()
        store = base.clone()  # our own connection, not the job's
        store.set_timeout(datetime.timedelta(seconds=WAIT_S))
        waker = base.clone()  # (a client's call holds its connection while it waits: another one wakes it)
        waker.set_timeout(datetime.timedelta(seconds=JOIN_S))
    except Exception:  # noqa: BLE001 - a FileStore or HashStore, an older torch: no exchange
        return
    _generation[0] += 1
    prefix = f"{PREFIX}/{_generation[0]}/"
    store, waker = dist.PrefixStore(prefix, store), dist.PrefixStore(prefix, waker)
    state = {"waits_for": None, "stopping": False}
    target = _serve if rank == 0 else _ping
    thread = threading.Thread(target=_guarded, args=(target, store, s.process_dir, rank, world_size, state),
                              name="stepscope-clock-sync", daemon=True)
    if not _active:
        atexit.register(_finish)
    _active.append((thread, waker, state))
    thread.start()


def _guarded(target, *args) -> None:
    try:
        target(*args)
    except Exception:  # noqa: BLE001 - a missing offset is a warning at merge time, never a failure here
        pass


def _finish() -> None:
    """At exit: each exchange still running is woken (the key it waits for, set through its
    waker) and joined, so that no thread is inside a store call when the interpreter ends."""
    for thread, waker, state in _active:
        state["stopping"] = True
        key = state["waits_for"]
        if thread.is_alive() and key is not None:
            try:
                waker.set(key, STOP)
            except Exception:  # noqa: BLE001 - the store's server is gone: the thread's call fails too
                pass
        thread.join(JOIN_S)
    _active.clear()


def _get(store, key: str, state: dict):
    """``store.get(key)``, saying which key is waited for (``_finish`` wakes it)."""
    state["waits_for"] = key
    try:
        return store.get(key)
    finally:
        state["waits_for"] = None


def _wall_offset(process_dir: str) -> int:
    """realtime - monotonic of this process's anchor: the reader's own conversion."""
    clock = runinfo.read_json(os.path.join(process_dir, PROCESS_JSON)).get("clock", {})
    return int(clock.get("realtime_ns", 0)) - int(clock.get("monotonic_ns", 0))


def _serve(store, process_dir: str, rank: int, world_size: int, state: dict) -> None:
    offset = _wall_offset(process_dir)
    me = {"host": runinfo.hostname(), "pid": os.getpid(), "rank": rank}
    _write(process_dir, {"reference": me, "is_reference": True, "wall_offset_ns": offset, "samples": []})
    # One long wait per ping, not short polls: a c10d wait that times out writes a
    # warning on the job's stderr. The last rank to finish ends the loop with a stop ping.
    store.set_timeout(datetime.timedelta(seconds=SERVE_S))
    store.set("ref", json.dumps(me))
    ticket = 1
    while not state["stopping"]:
        ping = _get(store, f"ping/{ticket}", state)
        wall = time.monotonic_ns() + offset
        if ping == STOP or state["stopping"]:
            return
        store.set(f"pong/{ticket}", str(wall))
        store.delete_key(f"ping/{ticket}")
        ticket += 1


def _ping(store, process_dir: str, rank: int, world_size: int, state: dict) -> None:
    try:
        ref = _poll(store, "ref", state)
        if ref is None:  # rank 0 is not profiled: nothing to measure against
            return
        host = runinfo.hostname()
        record = {"reference": ref, "host": host, "rank": rank, "method": "c10d-store", "samples": []}
        if ref.get("host") == host:  # one CLOCK_MONOTONIC: the merge needs no sample
            record["same_host"] = True
        else:
            for _ in range(PINGS):
                if state["stopping"]:
                    return
                ticket = int(store.add("tickets", 1))
                t0 = time.monotonic_ns()
                store.set(f"ping/{ticket}", b"")
                answer = _get(store, f"pong/{ticket}", state)
                if answer == STOP:
                    return
                answer = int(answer)
                t1 = time.monotonic_ns()
                store.delete_key(f"pong/{ticket}")
                record["samples"].append({"mono_ns": (t0 + t1) // 2, "ref_wall_ns": answer, "rtt_ns": t1 - t0})
        _write(process_dir, record)
    finally:
        if not state["stopping"] and int(store.add("done", 1)) == world_size - 1:  # the last: rank 0 may stop
            store.set(f"ping/{int(store.add('tickets', 1))}", STOP)


def _poll(store, key: str, state: dict):
    """The reference's announcement, polled (quietly: no c10d timeout warning) for WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and not state["stopping"]:
        if store.check([key]):
            return json.loads(store.get(key))
        time.sleep(0.01)
    return None


def _write(process_dir: str, record: dict) -> None:
    record["version"] = 1
    runinfo.write_json_atomic(os.path.join(process_dir, CLOCK_JSON), record)
