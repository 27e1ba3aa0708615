"""The newcomer's list (issue 41 part 6): what a new user trips over, each checked here."""
from __future__ import annotations

import io
import json
import time

import pytest

import polyindex
from polyindex.ingest.progress_log import LogProgress


# -- progress as log lines where stderr is not a terminal ---------------------------------------

def test_log_progress_writes_rate_and_eta_lines_periodically():
    stream = io.StringIO()
    with LogProgress("docs", every=0.02, stream=stream) as bar:
        task = bar.add_task("indexing d.jsonl", total=1000)
        bar.advance(task, 250)
        deadline = time.monotonic() + 10
        while stream.getvalue().count("\n") < 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # lines come from the timer thread, not from advance
        middle = stream.getvalue().splitlines()
        bar.advance(task, 750)
    lines = stream.getvalue().splitlines()
    assert len(middle) >= 2
    assert middle[0].startswith("progress: indexing d.jsonl: 250/1,000 docs (25%)")
    assert "docs/s" in middle[0] and "ETA" in middle[0]
    assert lines[-1].startswith("progress: indexing d.jsonl: 1,000/1,000 docs (100%)")
    assert "ETA" not in lines[-1]  # done


def test_index_into_a_pipe_prints_progress_lines(tmp_path, cli, corpus, setting, monkeypatch):
    src = tmp_path / "d.jsonl"
    corpus.make(src, 1500, seed=3)
    monkeypatch.setenv("POLYINDEX_PROGRESS_SECONDS", "0.05")  # the child reads it
    res = cli("index", src, "--data", tmp_path / "D", "-c", "c", "--index", "lexical",
              "--model", "none", "--segment-size", "500")
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("progress: ")]
    records = [ln for ln in lines if "indexing d.jsonl" in ln]
    assert records and records[-1].startswith("progress: indexing d.jsonl: 1,500/1,500 docs")
    assert any("building lexical" in ln for ln in lines)
    assert "docs/s" in records[-1]
