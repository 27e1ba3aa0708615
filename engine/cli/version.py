"""The installed distribution's version (pyproject.toml's ``version``), read from its metadata."""
from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("polyindex")
except PackageNotFoundError:  # a source tree on sys.path that was never pip-installed
    __version__ = "0+unknown"
