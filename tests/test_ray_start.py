"""Starting a local Ray again when its raylet never registers (a fault seen inside long
pytest runs): the half-started node's processes are stopped and the second start serves."""
import os
import subprocess
import sys
import time

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'polyindex[ray]')")

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
        assert len(calls) == 2
        assert r.get(r.put(41)) == 41
        stuck[0].wait(timeout=10)  # reaped here: the start killed it
        assert stuck[0].returncode == -9
    finally:
        r.shutdown()


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


def test_the_last_timeout_is_raised(monkeypatch):
    calls = []

    def never(*args, **kwargs):
        calls.append(1)
        raise Exception(TIMEOUT)

    monkeypatch.setattr(ray, "init", never)
    with pytest.raises(Exception, match="timed out during startup"):
        cluster.start(num_cpus=1)
    assert len(calls) == cluster.START_ATTEMPTS
