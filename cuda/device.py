"""GPU placement: asked for explicitly, never required to import polyindex.

A placement is ``cpu`` or ``cuda``. ``cuda`` needs a GPU that torch (the tensor kernels of this
package) or faiss (``faiss-gpu``, the ``gpu`` extra) can see; asking for it without one is a
clear error. The scoring kernels of ``polyindex.cuda`` are torch tensor programs that run on
either device: a ``cuda`` placement always uses them, and ``POLYINDEX_KERNELS=torch`` makes a
``cpu`` placement use them too, so the GPU's code path runs (and is tested) on a CPU.
torch, faiss and triton are imported only when asked for.
"""
from __future__ import annotations

import functools

from polyindex.config import settings
from polyindex.errors import InvalidArgument

DEVICES = ("cpu", "cuda")
FAISS_GPU_MAX_K = 2048  # faiss GPU's limit on k and nprobe (GPU_MAX_SELECTION_K)


def faiss_gpu_count() -> int:
    try:
        import faiss
    except ImportError:  # the device machines carry torch, not faiss
        return 0
    get = getattr(faiss, "get_num_gpus", None)
    return int(get()) if get is not None else 0


def torch_cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def check_device(device: str) -> str:
    """Validate a placement; asking for CUDA without a usable GPU is a clear error."""
    if device not in DEVICES:
        raise InvalidArgument(f"device must be one of {DEVICES}, got {device!r}")
    if device == "cuda" and not torch_cuda_available() and faiss_gpu_count() == 0:
        raise InvalidArgument("device 'cuda' was asked for, but neither torch nor faiss sees "
                              "a GPU (needs an NVIDIA GPU with a CUDA build of torch, or "
                              "faiss-gpu: the 'gpu' extra)")
    return device


def torch_kernels(device: str) -> bool:
    """Whether a placement scores with the torch kernels of ``polyindex.cuda``."""
    return device == "cuda" or settings().kernels == "torch"


def kernel_device(device: str) -> str:
    """The torch device the kernels of a placement run on ("cuda" only with a GPU torch sees)."""
    if device == "cuda" and not torch_cuda_available():
        raise InvalidArgument("device 'cuda': torch sees no GPU, so the cuda/ kernels cannot "
                              "run (a CUDA build of torch is needed)")
    return device


@functools.cache
def gpu_resources():
    """One faiss ``StandardGpuResources`` per process (its scratch memory and streams), shared
    by every index moved to the GPU: one per segment would pin memory per segment."""
    import faiss
    return faiss.StandardGpuResources()


def to_device(index, device: str):
    """Move a faiss index to the GPU when asked and faiss-gpu is there (float16 storage);
    else the CPU index unchanged (a cuda placement without faiss-gpu scores with the torch
    kernels of ``polyindex.cuda.dense`` over the same index's data)."""
    if device != "cuda" or faiss_gpu_count() == 0:
        return index
    import faiss
    opts = faiss.GpuClonerOptions()
    opts.useFloat16 = True
    return faiss.index_cpu_to_gpu(gpu_resources(), 0, index, opts)
