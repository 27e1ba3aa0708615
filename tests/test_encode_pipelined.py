"""The accelerator's encode path (tokenizing threads ahead of the model) gives the embeddings
``SentenceTransformer.encode`` gives, in the input's order, and reports every text once. It
runs on the CPU here with the real model; on a GPU only the device differs. One text on the
CPU (a query: ``Encoder._one``) gives ``model.encode``'s vector bit for bit."""
import numpy as np
import pytest

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


@pytest.mark.slow  # loads the model in a second precision
def test_one_text_is_the_models_own_encode_bit_for_bit():
    """A query's encoding (``Encoder.encode`` of one text on the CPU: ``_one``, without
    ``model.encode``'s per-call work) gives ``model.encode``'s vector, bit for bit, in both
    precisions; a prompt the model would add keeps ``model.encode``."""
    for dtype in ("float32", "bfloat16"):
        enc = get_encoder(dtype=dtype)
        assert enc.one_fast
        for text in TEXTS[:3] + TEXTS[-4:] + ["Ünïcode — naïve café", "\tq\n"]:
            want = enc.model.encode([text], normalize_embeddings=True, convert_to_numpy=True,
                                    show_progress_bar=False)
            got = enc.encode([text])
            assert got.dtype == np.float32 and got.shape == want.shape
            assert got.tobytes() == want.astype(np.float32).tobytes(), (dtype, text[:20])
    enc.model.train()  # as a caller that trained it would leave it: dropout must be off
    assert enc.encode([TEXTS[0]]).tobytes() == enc.model.encode(
        [TEXTS[0]], normalize_embeddings=True, convert_to_numpy=True,
        show_progress_bar=False).astype(np.float32).tobytes()
    from polyindex.encode.text import _plain
    enc.model.default_prompt_name = "query"
    try:
        assert not _plain(enc.model)
    finally:
        enc.model.default_prompt_name = None
