"""The model's precision for a new collection given none (``auto``): bfloat16 where the
hardware runs it natively (a GPU; a CPU with AVX-512 BF16 or AMX), else float32.

On CPUs without native bfloat16 (AVX2 only) torch emulates it and encoding measured 5-8x
slower than float32 (docs/notes/newcomer.md), so a newcomer's first index would be slow
for nothing. The choice is made once, when the collection is created, and stored with it: its
documents and queries are all encoded in that precision wherever it is opened later (bfloat16
and float32 embeddings of the same text have cosine >= 0.9999, so either is comparable).
The CPU's flags are read from /proc/cpuinfo (no torch import, no measurement: deterministic);
where that file is missing (macOS, Windows), torch's own check answers.
"""
from __future__ import annotations

from pathlib import Path

from polyindex.errors import InvalidArgument

AUTO = "auto"
DTYPES = ("bfloat16", "float32", "float16")
BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # Linux's names of native bfloat16 arithmetic
CPUINFO = Path("/proc/cpuinfo")


def cpu_flags(text: str | None = None) -> set[str] | None:
    """The CPU's feature flags (the ``flags`` line of /proc/cpuinfo); None where unknown."""
    if text is None:
        try:
            text = CPUINFO.read_text(errors="replace")
        except OSError:
            return None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            return set(value.split())
    return None


def _torch_has_bf16() -> bool:
    import torch  # only where /proc/cpuinfo says nothing
    checks = [getattr(torch.cpu, n, None) for n in ("_is_avx512_bf16_supported",
                                                    "_is_amx_tile_supported")]
    return any(c is not None and c() for c in checks)


def choose(device: str = "cpu", flags: set[str] | None = None) -> tuple[str, str]:
    """(dtype, why) for ``auto`` on ``device``; ``flags`` overrides the CPU's (for tests)."""
    if device != "cpu":
        return "bfloat16", f"auto: {device} runs bfloat16 natively"
    flags = cpu_flags() if flags is None else flags
    if flags is None:
        native = _torch_has_bf16()
        return (("bfloat16", "auto: torch reports native bfloat16 on this CPU") if native else
                ("float32", "auto: torch reports no native bfloat16 on this CPU"))
    have = [f for f in BF16_FLAGS if f in flags]
    if have:
        return "bfloat16", f"auto: the CPU has {'/'.join(have)}"
    return "float32", "auto: the CPU has no avx512_bf16/amx_bf16 (bfloat16 would be emulated)"


def resolve(dtype: str | None, device: str = "cpu") -> tuple[str, str]:
    """A new collection's (dtype, why): ``auto`` (or None) chosen here, else the one given."""
    if dtype is None or dtype == AUTO:
        return choose(device)
    if dtype not in DTYPES:
        raise InvalidArgument(f"dtype must be auto, bfloat16, float16 or float32, got {dtype!r}")
    return dtype, "given"
