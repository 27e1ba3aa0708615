"""``bench/device_check.py --device cpu`` (small sizes): the prepared GPU check runs unchanged
on a CPU, every kernel agrees with its CPU twin, and it writes its JSON and table."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_device_check_cpu_smoke(tmp_path):
    # --model none: the encode rate over a random-weight MiniLM-shaped model (no model load)
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "device_check.py"),
                           "--out", str(tmp_path), "--device", "cpu", "--model", "none"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "device_check.json").read_text())
    kernels = {r["kernel"]: r for r in report["correctness"]}
    assert len(kernels) == 6 and all(r["ok"] for r in kernels.values()), kernels
    assert all(r["max_rel_err"] <= 1e-4 and r["same_topk"] for r in kernels.values())
    what = [r["what"] for r in report["ratios"]]
    assert [w.split()[0] for w in what] == ["encode", "multivector", "mv", "dense", "sparse"]
    assert all(r["cpu"] > 0 and r["device"] > 0 for r in report["ratios"])
    assert report["multivector"][0]["recall_at_100_vs_cpu"] == 1.0
    # the batched CPU path (search_snapshot's kernels) finds what one query at a time finds
    assert report["multivector"][0]["cpu_batch_same_top_vs_one"] == 1.0
    assert report["sparse"]["same_top100"] and report["dense"]["same_top100_fraction"] == 1.0
    assert "throughput" in (tmp_path / "device_check.txt").read_text()
