"""CPU pinning for ``polyindex serve --cpus``.

A gRPC call crosses several threads (gRPC's poller, the Python worker, the client). On a small
VM, waking a thread on another vCPU costs an inter-processor interrupt through the hypervisor:
measured here (2 vCPUs, npl, one client) a no-op call took 0.51 ms with the server free to use
both vCPUs and 0.27 ms with the server pinned to one and the client on the other. Pinning
trades that latency for the server's use of the other cores (see bench/README.md, bench_grpc).
"""
from __future__ import annotations

import os
from pathlib import Path

from polyindex.errors import InvalidArgument


def parse_cpus(text: str) -> set[int]:
    """``"1"``, ``"0,2"``, ``"0-3,6"`` -> a set of CPU numbers this process may run on."""
    cpus: set[int] = set()
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            first, last = int(lo), int(hi) if hi else int(lo)
            if first < 0 or last < first:
                raise ValueError
            cpus.update(range(first, last + 1))
    except ValueError:
        raise InvalidArgument(f"--cpus: expected CPU numbers like 1, 0,2 or 0-3, got {text!r}") \
            from None
    available_cpus()  # the platform check
    missing = sorted(c for c in cpus if c >= (os.cpu_count() or 1))
    if missing:
        raise InvalidArgument(f"--cpus {text}: this machine has no CPU {missing} "
                              f"(CPUs 0-{(os.cpu_count() or 1) - 1})")
    return cpus


def available_cpus() -> set[int]:
    if not hasattr(os, "sched_getaffinity"):
        raise InvalidArgument("--cpus needs Linux (sched_setaffinity)")
    return set(os.sched_getaffinity(0))


def pin_process(cpus: set[int]) -> None:
    """Pin every thread of this process (threads started later inherit it from their parent;
    the ones already running, e.g. numba's or BLAS's pools, are set one by one)."""
    available_cpus()  # the platform check
    for task in Path("/proc/self/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except ProcessLookupError:  # the thread ended meanwhile
            pass
        except OSError as e:  # e.g. CPUs outside this container's cpuset
            raise InvalidArgument(f"--cpus: cannot run on CPUs {sorted(cpus)}: {e.strerror}") \
                from None
