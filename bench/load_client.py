"""The light gRPC load client (bench/native/grpc_load.cc) from Python: build it on first use,
write the request messages, run N client processes together and gather what they measured.

Each client is its own process with its own connection (loopback TCP), making one call at a
time for a bounded time (and count) and reporting its calls, failures, latencies and its own
CPU time over the measured calls; ``run`` starts them, waits until every one has warmed up,
releases them together and returns the merged numbers. The C++ client's CPU per call is a
small part of the server's, so the measurement measures the server (issue 38 part 4).
"""
from __future__ import annotations

import json
import selectors
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
SOURCE = REPO / "bench" / "native" / "grpc_load.cc"
BINARY = REPO / "build" / "grpc_load"
MAX_CLIENTS = 64
MAX_SECONDS = 600.0


class LoadClientUnavailable(RuntimeError):
    """The C++ load client cannot be built here (no compiler, no gRPC C++ headers)."""


def binary() -> Path:
    """The client's executable, built with the Makefile's rule when absent or older than its
    source; ``LoadClientUnavailable`` saying what is missing otherwise."""
    if BINARY.is_file() and BINARY.stat().st_mtime >= SOURCE.stat().st_mtime:
        return BINARY
    missing = [tool for tool in ("make", "g++", "pkg-config") if shutil.which(tool) is None]
    if not missing and subprocess.run(["pkg-config", "--exists", "grpc++"]).returncode != 0:
        missing.append("gRPC C++ (pkg-config finds no grpc++)")
    if missing:
        raise LoadClientUnavailable(
            f"cannot build the C++ load client {BINARY.relative_to(REPO)}: missing "
            f"{', '.join(missing)} (install libgrpc++-dev, pkg-config and g++: `make native-deps`)")
    done = subprocess.run(["make", "-s", "--no-print-directory", "-C", str(REPO),
                           str(BINARY.relative_to(REPO))], capture_output=True, text=True)
    if done.returncode != 0 or not BINARY.is_file():
        raise LoadClientUnavailable(f"building {BINARY.relative_to(REPO)} failed:\n"
                                    f"{done.stdout[-2000:]}{done.stderr[-4000:]}")
    return BINARY


def write_requests(path: Path, requests: list[bytes]) -> Path:
    """The request messages as the client reads them: a 4-byte little-endian length, then the
    bytes, for each."""
    with open(path, "wb") as f:
        for r in requests:
            f.write(len(r).to_bytes(4, "little"))
            f.write(r)
    return path


def run(address: str, method: str, requests: list[bytes], clients: int, seconds: float,
        max_calls: int | None = None, warmup: int = 20, meter=None,
        tmp: Path | None = None) -> dict:
    """``clients`` client processes call ``method`` on ``address`` with ``requests`` (each
    client from its own starting index) for ``seconds`` (or ``max_calls`` each), started
    together once all have warmed up. ``meter``: an object whose ``start()`` runs just before
    the clients are released and whose ``stop()`` (a dict, merged into the result) right
    after the last one finished. Returns q/s, p50/p99 ms, calls, errors, the first error, and
    the clients' CPU: per call (us) and in cores over the measured time."""
    if not 1 <= clients <= MAX_CLIENTS:
        raise ValueError(f"clients must be 1..{MAX_CLIENTS}, got {clients}")
    if not 0 < seconds <= MAX_SECONDS:
        raise ValueError(f"seconds must be in (0, {MAX_SECONDS:.0f}], got {seconds}")
    exe = binary()
    folder = Path(tempfile.mkdtemp(prefix="grpc-load-", dir=tmp))
    procs: list[subprocess.Popen] = []
    try:
        req_file = write_requests(folder / "requests.bin", requests)
        step = max(len(requests) // clients, 1)
        for i in range(clients):
            cmd = [str(exe), address, method, str(req_file), "--seconds", str(seconds),
                   "--warmup", str(warmup), "--start", str(i * step),
                   "--latencies", str(folder / f"lat-{i}.f32"), "--wait-go"]
            if max_calls is not None:
                cmd += ["--max-calls", str(max_calls)]
            procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        _await_ready(procs, timeout=60.0 + warmup * 0.5)
        if meter is not None:
            meter.start()
        t0 = time.perf_counter()
        for p in procs:  # released together
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = []
        for i, p in enumerate(procs):
            out, err = p.communicate(timeout=seconds + 90)
            if p.returncode != 0:
                raise RuntimeError(f"load client {i} exited {p.returncode}: {err.strip()[-2000:]}")
            outs.append(json.loads(out.strip().splitlines()[-1]))
        wall = time.perf_counter() - t0
        metered = meter.stop() if meter is not None else {}
        lat = np.concatenate([np.fromfile(folder / f"lat-{i}.f32", dtype=np.float32)
                              for i in range(clients)])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(folder, ignore_errors=True)
    calls = sum(o["calls"] for o in outs)
    cpu = sum(o["cpu_user_s"] + o["cpu_sys_s"] for o in outs)
    measured = float(np.median([o["wall_s"] for o in outs]))
    res = {"qps": calls / measured if measured else 0.0,
           "p50_ms": float(np.percentile(lat, 50)) if len(lat) else float("nan"),
           "p99_ms": float(np.percentile(lat, 99)) if len(lat) else float("nan"),
           "calls": calls, "ok": sum(o["ok"] for o in outs),
           "errors": sum(o["errors"] for o in outs),
           "first_error": next((o["first_error"] for o in outs if o["first_error"]), None),
           "wall_s": wall, "client_cpu_us_per_call": cpu * 1e6 / calls if calls else 0.0,
           "client_cores": cpu / measured if measured else 0.0, "clients": clients}
    res.update(metered)
    return res


def _await_ready(procs: list[subprocess.Popen], timeout: float) -> None:
    """Until every client printed "ready" (warmed up); one that exits first is an error."""
    sel = selectors.DefaultSelector()
    for i, p in enumerate(procs):
        sel.register(p.stdout, selectors.EVENT_READ, i)
    waiting = set(range(len(procs)))
    deadline = time.monotonic() + timeout
    while waiting:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{len(waiting)} load clients did not warm up in {timeout:.0f} s")
        for key, _ in sel.select(left):
            i = key.data
            line = procs[i].stdout.readline()
            if line.strip() == "ready":
                waiting.discard(i)
                sel.unregister(key.fileobj)
            elif not line:
                procs[i].wait()
                raise RuntimeError(f"load client {i} exited {procs[i].returncode} before it was "
                                   f"ready: {procs[i].stderr.read().strip()[-2000:]}")
    sel.close()
