"""What pyproject.toml cannot express: the package list, derived, and the native extensions.

Metadata and package data are in pyproject.toml. The packages are every folder with an
``__init__.py`` under the roots ``PACKAGE_DIR`` maps into the one ``polyindex`` namespace, found
by walking them, so a new room ships without anyone editing a list (a hand-kept list once left
``polyindex.distributed`` out of the wheel). ``pip install .`` compiles
``polyindex.service._grpc_front`` and ``polyindex.client._grpc_channel`` when pkg-config finds
gRPC C++ (Debian: ``apt-get install libgrpc++-dev pkg-config``). Without it, or if the compiler
fails, the wheel is built without them and the build says so in one warning: polyindex then
serves and calls over grpcio (same behaviour, about 0.25 ms more a call). ``make native`` builds
the same files for developers.
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import warnings

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

# import name -> source folder; a root nested in another (engine holds none) would ship twice
PACKAGE_DIR = {"polyindex": "engine", "polyindex.index": "index", "polyindex.rerank": "rerank",
               "polyindex.proto": "proto", "polyindex.cuda": "cuda"}

NATIVE = {"polyindex.service._grpc_front": "engine/service/native/grpc_front.cc",
          "polyindex.client._grpc_channel": "engine/client/native/grpc_channel.cc"}
FALLBACK = ("polyindex: the native gRPC extensions are not built ({why}); the server and client "
            "will use grpcio. For the fast path: apt-get install libgrpc++-dev pkg-config, then "
            "reinstall.")


def _grpc_flags() -> tuple[list[str], list[str]] | str:
    """(compile flags, link flags) of gRPC C++ from pkg-config, or why they are unavailable."""
    if shutil.which("pkg-config") is None:
        return "pkg-config not found"
    cflags = subprocess.run(["pkg-config", "--cflags", "grpc++"], capture_output=True, text=True)
    libs = subprocess.run(["pkg-config", "--libs", "grpc++"], capture_output=True, text=True)
    if cflags.returncode or libs.returncode:
        return "pkg-config finds no grpc++"
    return shlex.split(cflags.stdout), shlex.split(libs.stdout)


class BuildNative(build_ext):
    """build_ext that asks pkg-config for gRPC C++ and skips (with one warning) without it."""

    def run(self) -> None:
        flags = _grpc_flags()
        if isinstance(flags, str):
            self._skip(flags)
            return
        for ext in self.extensions:
            ext.extra_compile_args += flags[0]
            ext.extra_link_args += flags[1]
        try:
            super().run()
        except Exception as e:  # noqa: BLE001 - CompileError, LinkError, a missing g++: fall back
            self._skip(f"the C++ build failed: {type(e).__name__}: {e}")

    def _skip(self, why: str) -> None:
        in_place = self.inplace or getattr(self, "editable_mode", False)
        for ext in [] if in_place else self.extensions:
            stale = self.get_ext_fullpath(ext.name)  # in build/, left by an earlier build:
            if os.path.exists(stale):                 # a wheel must not ship it
                os.remove(stale)
        self.extensions = []
        warnings.warn(FALLBACK.format(why=why), stacklevel=1)

    def get_ext_filename(self, fullname: str) -> str:
        # The plain name `make native` writes too (engine/service/_grpc_front.so), so an
        # editable install and `make native` never leave two copies that shadow each other;
        # the wheel's own tag (cp3XX-linux) already pins the interpreter.
        return os.path.join(*fullname.split(".")) + ".so"


def packages() -> list[str]:
    """Every package under each root of ``PACKAGE_DIR``, named in the polyindex namespace."""
    out = []
    for name, folder in PACKAGE_DIR.items():
        out.append(name)
        out += [f"{name}.{sub}" for sub in find_packages(folder)
                if f"{name}.{sub}" not in PACKAGE_DIR]
    return sorted(out)


setup(
    package_dir=PACKAGE_DIR,
    packages=packages(),
    ext_modules=[Extension(name, [src], include_dirs=["engine/wire/native"],
                           depends=["engine/wire/native/byte_buffer.h"], language="c++",
                           extra_compile_args=["-O2", "-g0", "-std=c++17", "-fvisibility=hidden"])
                 for name, src in NATIVE.items()],
    cmdclass={"build_ext": BuildNative},
)
