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
"""

from __future__ import annotations

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


def start(dist, rank: int, world_size: int) -> None:
    """Starts the exchange in a daemon thread; never raises, never blocks."""
    from stepscope.core import session

    s = session.current()
    if s is None or world_size is None or world_size < 2:
        return
    try:
        from torch.distributed import distributed_c10d

        store = distributed_c10d._get_default_store().clone()  # our own connection, not the job's
        store.set_timeout(datetime.timedelta(seconds=WAIT_S))
    except Exception:  # noqa: BLE001 - a FileStore or HashStore, an older torch: no exchange
        return
    _generation[0] += 1
    store = dist.PrefixStore(f"{PREFIX}/{_generation[0]}/", store)
    target = _serve if rank == 0 else _ping
    threading.Thread(target=_guarded, args=(target, store, s.process_dir, rank, world_size),
                     name="stepscope-clock-sync", daemon=True).start()


def _guarded(target, *args) -> None:
    try:
        target(*args)
    except Exception:  # noqa: BLE001 - a missing offset is a warning at merge time, never a failure here
        pass


def _wall_offset(process_dir: str) -> int:
    """realtime - monotonic of this process's anchor: the reader's own conversion."""
    clock = runinfo.read_json(os.path.join(process_dir, PROCESS_JSON)).get("clock", {})
    return int(clock.get("realtime_ns", 0)) - int(clock.get("monotonic_ns", 0))


def _serve(store, process_dir: str, rank: int, world_size: int) -> None:
    offset = _wall_offset(process_dir)
    me = {"host": runinfo.hostname(), "pid": os.getpid(), "rank": rank}
    _write(process_dir, {"reference": me, "is_reference": True, "wall_offset_ns": offset, "samples": []})
    # One long wait per ping, not short polls: a c10d wait that times out writes a
    # warning on the job's stderr. The last rank to finish ends the loop with a stop ping.
    store.set_timeout(datetime.timedelta(seconds=SERVE_S))
    store.set("ref", json.dumps(me))
    ticket = 1
    while True:
        ping = store.get(f"ping/{ticket}")
        wall = time.monotonic_ns() + offset
        if ping == STOP:
            return
        store.set(f"pong/{ticket}", str(wall))
        store.delete_key(f"ping/{ticket}")
        ticket += 1


def _ping(store, process_dir: str, rank: int, world_size: int) -> None:
    try:
        ref = _poll(store, "ref")
        if ref is None:  # rank 0 is not profiled: nothing to measure against
            return
        host = runinfo.hostname()
        record = {"reference": ref, "host": host, "rank": rank, "method": "c10d-store", "samples": []}
        if ref.get("host") == host:  # one CLOCK_MONOTONIC: the merge needs no sample
            record["same_host"] = True
        else:
            for _ in range(PINGS):
                ticket = int(store.add("tickets", 1))
                t0 = time.monotonic_ns()
                store.set(f"ping/{ticket}", b"")
                answer = int(store.get(f"pong/{ticket}"))
                t1 = time.monotonic_ns()
                store.delete_key(f"pong/{ticket}")
                record["samples"].append({"mono_ns": (t0 + t1) // 2, "ref_wall_ns": answer, "rtt_ns": t1 - t0})
        _write(process_dir, record)
    finally:
        if int(store.add("done", 1)) == world_size - 1:  # the last one: rank 0 may stop serving
            store.set(f"ping/{int(store.add('tickets', 1))}", STOP)


def _poll(store, key: str):
    """The reference's announcement, polled (quietly: no c10d timeout warning) for WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if store.check([key]):
            return json.loads(store.get(key))
        time.sleep(0.01)
    return None


def _write(process_dir: str, record: dict) -> None:
    record["version"] = 1
    runinfo.write_json_atomic(os.path.join(process_dir, CLOCK_JSON), record)
