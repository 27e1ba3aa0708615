"""Headless Chromium (Debian's ``chromium``) for the console's browser tests and the
screenshot script: the DOM after the page's JS ran, or a screenshot. Nothing is downloaded."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

CHROMIUM = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser")) if p),
                None)
MISSING = ("headless Chromium is not installed (Debian: apt-get install chromium; "
           "`make test` installs it where apt-get may)")


def _args(profile: str, budget_ms: int) -> list[str]:
    # --no-sandbox: Chromium refuses to run as root otherwise (CI runs as root); the pages
    # are our own, served on loopback
    flags = ["--headless", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
             f"--user-data-dir={profile}", f"--virtual-time-budget={budget_ms}"]
    if os.geteuid() == 0:
        flags.append("--no-sandbox")
    return [CHROMIUM, *flags]


def dump_dom(url: str, budget_ms: int = 20_000, timeout: float = 120) -> str:
    """The page's DOM once its scripts and requests settled (virtual time)."""
    with tempfile.TemporaryDirectory(prefix="polyindex-chromium-") as profile:
        res = subprocess.run([*_args(profile, budget_ms), "--dump-dom", url],
                             capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(f"chromium failed ({res.returncode}): {res.stderr[-2000:]}")
    return res.stdout


def screenshot(url: str, path, size=(1400, 1000), budget_ms: int = 20_000,
               timeout: float = 120) -> None:
    with tempfile.TemporaryDirectory(prefix="polyindex-chromium-") as profile:
        res = subprocess.run([*_args(profile, budget_ms), f"--window-size={size[0]},{size[1]}",
                              f"--screenshot={path}", url],
                             capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0 or not os.path.exists(path):
        raise RuntimeError(f"chromium failed ({res.returncode}): {res.stderr[-2000:]}")
