"""Per-token encoders for late interaction (the ``multivector`` kind).

A token encoder turns a document into ``DocTokens``: an ``(n_tokens, d)`` matrix of
L2-normalized vectors, which of them are special tokens, and optionally a salience per token
(used for pruning) and vocabulary ids (the IDF fallback of pruning). Any encoder with the
``TokenEncoder`` shape plugs in: an image-patch model (a local ColPali folder) yields one
vector per patch, without ids, and pruning then falls back to the IDF of the patch's code.

``SentenceTokenEncoder`` wraps the collection's sentence-transformers ``Encoder``: one forward
pass gives both the dense sentence embedding and the token embeddings (the transformer's last
hidden states), so a collection with ``dense`` and ``multivector`` encodes each document once.
Salience is the attention each token receives in the last layer (mean over heads, summed over
the real query positions), computed from that layer's own query/key projections captured by a
hook: the same numbers ``output_attentions`` gives, without switching every layer from SDPA to
the slower eager attention.
"""
from __future__ import annotations

import threading
from typing import Callable, Protocol, Sequence

import numpy as np

from polyindex.encode.text import batching
from polyindex.errors import check_cancelled
from polyindex.index.protocol import DocTokens


class TokenEncoder(Protocol):
    name: str
    dim: int

    def encode_documents(self, texts: Sequence[str], *, salience: bool = False,
                         on_batch: Callable[[int], None] | None = None
                         ) -> tuple[np.ndarray | None, list[DocTokens]]:
        """(sentence embeddings (n, d) float32 or None, per-document tokens)."""

    def encode_queries(self, texts: Sequence[str]) -> list[DocTokens]:
        """Per-query tokens in full precision (float32)."""


def _last_self_attention(model):
    """The last module that looks like a BERT-style self-attention (query/key projections)."""
    last = None
    for mod in model.modules():
        if all(hasattr(mod, a) for a in ("query", "key", "attention_head_size")):
            last = mod
    return last


class SentenceTokenEncoder:
    """Token embeddings (and the sentence embedding) from a sentence-transformers model."""

    def __init__(self, encoder):
        self.encoder = encoder
        self.model = encoder.model
        self.name, self.dim = encoder.name, encoder.dim
        tok = self.model.tokenizer
        self.special_ids = np.array(sorted(set(tok.all_special_ids)), dtype=np.int64)
        inner = getattr(self.model[0], "auto_model", None) if len(self.model) else None
        self._attn = _last_self_attention(inner) if inner is not None else None
        self._lock = threading.Lock()  # hooks are per model: one salience pass at a time

    # -- salience hook -----------------------------------------------------------------------
    def _salience_hooks(self):
        import torch
        # per thread: a query encoded by another thread meanwhile runs through the same hooks
        captured = threading.local()

        def pre(module, args, kwargs):
            captured.h = args[0] if args else kwargs["hidden_states"]

        def post(module, args, out):
            h, mask = getattr(captured, "h", None), out.get("attention_mask")
            captured.h = None
            if h is None or mask is None:
                return out
            a = self._attn
            b, n, _ = h.shape
            q = a.query(h).view(b, n, -1, a.attention_head_size).transpose(1, 2).float()
            k = a.key(h).view(b, n, -1, a.attention_head_size).transpose(1, 2).float()
            logits = (q @ k.transpose(-1, -2)) * (a.attention_head_size ** -0.5)
            valid = mask.bool()
            logits = logits.masked_fill(~valid[:, None, None, :], float("-inf"))
            probs = torch.softmax(logits, dim=-1) * valid[:, None, :, None]  # real queries only
            out["token_salience"] = probs.mean(1).sum(1)  # (b, n): attention received
            return out

        return (self._attn.register_forward_pre_hook(pre, with_kwargs=True),
                self.model.register_forward_hook(post))

    # -- encoding ----------------------------------------------------------------------------
    def _forward(self, texts: Sequence[str], batch_size: int, salience: bool) -> list[dict]:
        import torch
        hooks = self._salience_hooks() if salience and self._attn is not None else ()
        try:
            with torch.inference_mode():
                return self.model.encode(list(texts), batch_size=batch_size, output_value=None,
                                         convert_to_numpy=False, show_progress_bar=False)
        finally:
            for hk in hooks:
                hk.remove()

    def _tokens(self, item: dict, dtype) -> DocTokens:
        mask = item["attention_mask"].bool()
        n = int(mask.sum())
        ids = item["input_ids"][:n].cpu().numpy().astype(np.int32)
        vec = item["token_embeddings"][:n].float()  # normalized where the model ran (GPU)
        vec = (vec / vec.norm(dim=1, keepdim=True).clamp_min(1e-12)).cpu().numpy().astype(dtype)
        sal = item.get("token_salience")
        return DocTokens(vec, np.isin(ids, self.special_ids),
                         None if sal is None else sal[:n].float().cpu().numpy(), ids)

    def encode_documents(self, texts: Sequence[str], *, salience: bool = False,
                         on_batch: Callable[[int], None] | None = None,
                         batch_size: int | None = None,
                         chunk: int | None = None) -> tuple[np.ndarray, list[DocTokens]]:
        """Longest-first chunks, like ``Encoder.encode`` (the same batches, so the sentence
        embeddings equal what it returns); tokens are stored as float16 (the model runs in
        bfloat16, so float16 loses nothing) to bound a segment's memory."""
        import torch
        batch_size, chunk = batching(self.encoder.device, batch_size, chunk)
        n = len(texts)
        emb = np.empty((n, self.dim), dtype=np.float32)
        toks: list[DocTokens | None] = [None] * n
        order = np.argsort([-len(t) for t in texts], kind="stable")
        with self._lock:
            for start in range(0, n, chunk):
                check_cancelled(f"encoding the tokens of {n} texts")
                idx = order[start:start + chunk]
                items = self._forward([texts[i] for i in idx], batch_size, salience)
                sent = torch.stack([it["sentence_embedding"] for it in items])
                emb[idx] = torch.nn.functional.normalize(sent, p=2, dim=1).float().cpu().numpy()
                for i, it in zip(idx, items):
                    toks[i] = self._tokens(it, np.float16)
                if on_batch is not None:
                    on_batch(len(idx))
        return emb, toks

    def encode_queries(self, texts: Sequence[str]) -> list[DocTokens]:
        return self.encode_queries_both(texts)[1]

    def encode_queries_both(self, texts: Sequence[str]) -> tuple[np.ndarray, list[DocTokens]]:
        """(sentence embeddings (n, d) float32 L2-normalized, per-query tokens float32) from
        one forward pass: a profile that needs both (``hybrid-mv``) encodes a query once."""
        import torch
        items = self._forward(texts, 64, False)
        if not items:
            return np.zeros((0, self.dim), np.float32), []
        sent = torch.stack([it["sentence_embedding"] for it in items])
        emb = torch.nn.functional.normalize(sent, p=2, dim=1).float().cpu().numpy()
        return emb, [self._tokens(it, np.float32) for it in items]


_TOKEN_ENCODERS: dict[int, SentenceTokenEncoder] = {}
_LOCK = threading.Lock()


def token_encoder_for(encoder) -> SentenceTokenEncoder:
    """One token encoder per loaded ``Encoder`` (it shares the model)."""
    with _LOCK:
        key = id(encoder)
        if key not in _TOKEN_ENCODERS:
            _TOKEN_ENCODERS[key] = SentenceTokenEncoder(encoder)
        return _TOKEN_ENCODERS[key]


def get_token_encoder(model: str, dtype: str = "bfloat16",
                      device: str = "cpu", fingerprint: str | None = None) -> SentenceTokenEncoder:
    from polyindex.encode.text import get_encoder
    return token_encoder_for(get_encoder(model, dtype, device, fingerprint))
