"""Starting or joining Ray, loopback-only unless an address is given.

Everything Ray-facing imports ``ray`` through :func:`require_ray`, so a machine without the
optional extra gets one clear line saying how to install it instead of an ImportError deep in
a command.
"""
from __future__ import annotations

import os

from polyindex.errors import InvalidArgument

INSTALL_HINT = "Ray is not installed: pip install 'polyindex[ray]' (or pip install 'ray[data]')"

# Bounded so a test or a laptop does not hand Ray a third of its RAM by default.
DEFAULT_OBJECT_STORE_BYTES = 256 * 1024 * 1024


def require_ray():
    """The ``ray`` module, or InvalidArgument with the install line."""
    try:
        import ray
    except ImportError as e:
        raise InvalidArgument(INSTALL_HINT) from e
    return ray


def loopback_environment() -> None:
    """Make every socket of a Ray started from here bind 127.0.0.1 and send no usage stats.

    Must run before ``import ray`` (Ray reads them into its constants at import)."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_DISABLE_IMPORT_WARNING", "1")


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
    else:
        ray.init(address="local", include_dashboard=False, num_cpus=num_cpus,
                 object_store_memory=object_store_bytes, log_to_driver=False)
    return ray
