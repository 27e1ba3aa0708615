"""GPU placement: asked for explicitly, never required to import polyindex."""
from __future__ import annotations

from polyindex.errors import InvalidArgument

DEVICES = ("cpu", "cuda")


def faiss_gpu_count() -> int:
    import faiss
    get = getattr(faiss, "get_num_gpus", None)
    return int(get()) if get is not None else 0


def check_device(device: str) -> str:
    """Validate a placement; asking for CUDA without a usable GPU is a clear error."""
    if device not in DEVICES:
        raise InvalidArgument(f"device must be one of {DEVICES}, got {device!r}")
    if device == "cuda" and faiss_gpu_count() == 0:
        raise InvalidArgument("device 'cuda' was asked for, but faiss sees no GPU (install the "
                              "'gpu' extra, faiss-gpu, on a machine with an NVIDIA GPU)")
    return device


def to_device(index, device: str):
    """Move a faiss index to the GPU when asked; the CPU index is returned unchanged otherwise."""
    if device != "cuda":
        return index
    import faiss
    return faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, index)
