"""The accelerator's encode path (tokenizing threads ahead of the model) gives the embeddings
``SentenceTransformer.encode`` gives, in the input's order, and reports every text once. It
runs on the CPU here with the real model; on a GPU only the device differs."""
import numpy as np

from polyindex.encode import pipelined
from polyindex.encode.text import get_encoder

TEXTS = ["boundary layer transition on a flat plate at supersonic speed " * (1 + i % 7)
         for i in range(37)] + ["", "  padded  ", "a", "shock wave " * 400]  # truncated


def test_pipelined_encoding_matches_the_models_own():
    enc = get_encoder(dtype="float32")
    want = enc.model.encode(TEXTS, batch_size=8, normalize_embeddings=True,
                            convert_to_numpy=True, show_progress_bar=False)
    seen = []
    got = pipelined.encode(enc.model, TEXTS, batch_size=8, threads=3, on_batch=seen.append)
    assert got.shape == want.shape and got.dtype == np.float32
    assert np.abs(got - want).max() < 1e-5
    assert sum(seen) == len(TEXTS) and seen[:-1] == [8] * (len(seen) - 1)
    # more threads than batches, and one batch
    assert np.abs(pipelined.encode(enc.model, TEXTS[:5], 8, 4) - want[:5]).max() < 1e-5
