"""Starting a local Ray again when its raylet never registers (a fault seen inside long
pytest runs): the half-started node's processes are stopped and the second start serves."""
import os
import subprocess
import sys
import time

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'ray[data]')")

from polyindex.distributed import cluster  # noqa: E402

TIMEOUT = ("The current node timed out during startup. This could happen because some of "
           "the raylet failed to startup or the GCS has become overloaded.")


def test_a_raylet_that_never_registers_is_started_again(monkeypatch):
    assert not ray.is_initialized()
    real_init = ray.init
    calls, stuck = [], []

    def failing_once(*args, **kwargs):
        calls.append(kwargs)
        if len(calls) == 1:
            # What a failed start leaves: a child running Ray's code, and Ray's exception.
            stuck.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)",
                                           os.path.dirname(ray.__file__)]))
            raise Exception(TIMEOUT)
        return real_init(*args, **kwargs)

    monkeypatch.setattr(ray, "init", failing_once)
    r = cluster.start(num_cpus=1, object_store_bytes=80 * 1024 * 1024)
    try:
        assert len(calls) >= 2  # more if a real start hit the fault too
        assert r.get(r.put(41)) == 41
    finally:
        r.shutdown()
        stuck[0].kill()  # the start kills it (see below); never left running either way
        stuck[0].wait()


def test_the_children_a_failed_start_leaves_are_found():
    """What the retry kills: this process's children running Ray's code, and no others."""
    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                             os.path.dirname(ray.__file__)])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        found = cluster._ray_children(ray)
        assert ours.pid in found and other.pid not in found
    finally:
        for p in (ours, other):
            p.kill()
            p.wait()


def test_any_other_start_error_is_raised_at_once(monkeypatch):
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise ValueError("object_store_memory is too small")

    monkeypatch.setattr(ray, "init", broken)
    t = time.monotonic()
    with pytest.raises(ValueError, match="too small"):
        cluster.start(num_cpus=1)
    assert calls == [1] and time.monotonic() - t < 5


GCS_TIMEOUT = RuntimeError("Timed out waiting for file /tmp/ray/session_x/gcs_server_port_y")


@pytest.mark.parametrize("error", [Exception(TIMEOUT), GCS_TIMEOUT])
def test_each_startup_timeout_is_retried_and_the_last_raised(monkeypatch, error):
    calls = []

    def never(*args, **kwargs):
        calls.append(1)
        raise error

    monkeypatch.setattr(ray, "init", never)
    with pytest.raises(type(error), match="[Tt]imed out"):
        cluster.start(num_cpus=1)
    assert len(calls) == cluster.START_ATTEMPTS
