"""Starting or joining Ray, loopback-only unless an address is given.

Everything Ray-facing imports ``ray`` through :func:`require_ray`, so a machine without the
optional extra gets one clear line saying how to install it instead of an ImportError deep in
a command.
"""
from __future__ import annotations

import glob
import logging
import os
import pickle
import signal
import traceback

from polyindex.errors import Internal, InvalidArgument, PolyindexError, install_hint

log = logging.getLogger(__name__)


# Bounded so a test or a laptop does not hand Ray a third of its RAM by default.
DEFAULT_OBJECT_STORE_BYTES = 256 * 1024 * 1024

# A local start whose raylet never registers (Ray waits a fixed 30 s, then raises a bare
# Exception) or whose GCS never writes its port file (a RuntimeError) is tried again from
# scratch. Seen in 4 of ~30 starts inside long pytest runs, three of them a second or so
# after the previous local Ray of the same process shut down (the failed process never wrote
# a log), never in 30 starts from a fresh process; the next start always succeeded.
START_ATTEMPTS = 3
START_TIMEOUTS = ("timed out during startup", "Timed out waiting for file")


def require_ray():
    """The ``ray`` module, or InvalidArgument with the install line."""
    try:
        import ray
    except ImportError as e:
        raise InvalidArgument(f"Ray is not installed: {install_hint('ray', 'ray')}") from e
    return ray


def loopback_environment() -> None:
    """Make every socket of a Ray started from here bind 127.0.0.1 and send no usage stats.

    Must run before ``import ray`` (Ray reads them into its constants at import)."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_DISABLE_IMPORT_WARNING", "1")
    # Ray starts its workers at nice 15 by default: a shard actor answering queries would
    # wait behind every other process (measured: 17-84 ms a call on a busy 2-core machine,
    # against well under 1 ms for the query itself).
    os.environ.setdefault("RAY_worker_niceness", "0")


def start(address: str | None = None, *, num_cpus: int | None = None,
          object_store_bytes: int = DEFAULT_OBJECT_STORE_BYTES):
    """Join the cluster at ``address`` or start a local, loopback-only Ray (no dashboard).

    Returns the ``ray`` module. A Ray already initialised in this process is reused."""
    if not address:
        loopback_environment()  # before the import: ray reads it into its constants then
    ray = require_ray()
    if not address:
        # A ray imported before this (a test's importorskip, the user's script) read the
        # variable unset: its node address was eth0's and its servers listened on every
        # interface (tests/test_ray_loopback.py saw it). Its children read the environment.
        from ray._private import ray_constants
        ray_constants.ENABLE_RAY_CLUSTER = False
    if ray.is_initialized():
        return ray
    if address:
        ray.init(address=address, log_to_driver=False)
        return ray
    for attempt in range(1, START_ATTEMPTS + 1):
        before = _ray_children(ray)
        try:
            ray.init(address="local", include_dashboard=False, num_cpus=num_cpus,
                     object_store_memory=object_store_bytes, log_to_driver=False)
            return ray
        except Exception as e:  # Ray raises a bare Exception for the raylet's timeout
            if not any(t in str(e) for t in START_TIMEOUTS) or attempt == START_ATTEMPTS:
                raise
            log.warning("Ray did not start (attempt %d of %d: %s); starting it again",
                        attempt, START_ATTEMPTS, e)
            # ray.init lost the half-started node (its GCS, monitor, the stuck raylet), so
            # they are stopped here rather than left until this process exits.
            for pid in _ray_children(ray) - before:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            ray.shutdown()


def _ray_children(ray) -> set[int]:
    """Pids of this process's children that run Ray's own binaries or modules (Linux;
    an empty set where /proc does not list children)."""
    home = os.path.dirname(ray.__file__)
    pids = set()
    for listing in glob.glob(f"/proc/{os.getpid()}/task/*/children"):
        try:
            with open(listing) as f:
                pids.update(int(p) for p in f.read().split())
        except OSError:
            continue
    found = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if home.encode() in f.read():
                    found.add(pid)
        except OSError:
            continue
    return found


def error_bytes(e: BaseException) -> bytes:
    """An error as the driver will raise it: a polyindex error as itself (its message names
    the file and line), anything else as Internal with the worker's traceback."""
    if not isinstance(e, PolyindexError):
        e = Internal(f"ray worker (pid {os.getpid()}): "
                     + "".join(traceback.format_exception(e)).strip())
    try:
        data = pickle.dumps(e)
        pickle.loads(data)
        return data
    except Exception:  # noqa: BLE001 - an error class that does not round-trip
        return pickle.dumps(Internal(str(e)))
