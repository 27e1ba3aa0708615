"""The noisy student: a copy of the encoder fine-tuned with a contrastive loss.

Each step scores a batch of synthetic queries against their positives and hard negatives (the
other queries' documents are in-batch negatives): cross-entropy over scaled cosine similarities,
as sentence-transformers' MultipleNegativesRankingLoss, written as a plain torch loop so no
trainer dependency (datasets, accelerate) is needed. A column holding the same document as a
row's positive is masked for that row (no false in-batch negatives). Noise: the model's own
dropout (train mode) and, on queries, word dropout and shuffled term queries.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from polyindex.adapt.recipe import Recipe
from polyindex.adapt.teacher import Pair


def load(model_path: str, device: str, dtype: str = "float32"):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    return SentenceTransformer(model_path, device=device,
                               model_kwargs={"torch_dtype": getattr(torch, dtype)})


def noisy(query: str, kind: str, rng: np.random.Generator, recipe: Recipe) -> str:
    words = query.split()
    if len(words) > 2 and recipe.word_dropout > 0:
        keep = rng.random(len(words)) >= recipe.word_dropout
        if keep.sum() >= 2:
            words = [w for w, k in zip(words, keep) if k]
    if kind == "terms" and recipe.shuffle_terms:
        words = [words[i] for i in rng.permutation(len(words))]
    return " ".join(words)


def bf16_ok(device: str) -> bool:
    import torch
    if device.startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    try:  # avx512_bf16 / AMX make CPU bf16 autocast fast; without them it is slower than fp32
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def train(model, texts: Sequence[str], pairs: Sequence[Pair], recipe: Recipe, device: str,
          seed: int, progress: Callable[[str, int, int], None] | None = None,
          phase: str = "train") -> dict:
    """Fine-tune ``model`` in place on ``pairs``; a report of the run."""
    import torch
    torch.manual_seed(seed)
    rng = np.random.default_rng([seed, 3])
    model.max_seq_length = recipe.max_seq_length
    bs = recipe.batch_size
    per_epoch = max(1, len(pairs) // bs)  # a last short batch has too few in-batch negatives
    steps = min(recipe.max_steps, per_epoch * recipe.epochs)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.01)
    warm = max(1, int(steps * recipe.warmup))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warm, max(0.0, (steps - s) / max(1, steps - warm))))
    use_bf16 = recipe.bf16 and bf16_ok(device)
    dev_type = "cuda" if device.startswith("cuda") else "cpu"
    model.train()
    losses, order, t0 = [], np.array([], dtype=np.int64), time.perf_counter()
    for step in range(steps):
        if len(order) < bs:
            order = np.concatenate([order, rng.permutation(len(pairs))])
        batch = [pairs[i] for i in order[:bs]]
        order = order[bs:]
        queries = [noisy(p.query, p.kind, rng, recipe) for p in batch]
        docs = [p.positive for p in batch]
        doc_rows = [p.doc for p in batch]
        for p in batch:
            if p.negative is not None:
                docs.append(texts[p.negative])
                doc_rows.append(p.negative)
        with torch.autocast(dev_type, dtype=torch.bfloat16, enabled=use_bf16):
            q = _embed(model, queries, device)
            d = _embed(model, docs, device)
            scores = (q.float() @ d.float().T) * recipe.scale
        pos = torch.tensor([p.doc for p in batch], device=scores.device)
        cols = torch.tensor(doc_rows, device=scores.device)
        same = (pos[:, None] == cols[None, :])
        same.fill_diagonal_(False)  # a row's own positive stays
        scores = scores.masked_fill(same, float("-inf"))
        loss = torch.nn.functional.cross_entropy(scores, torch.arange(len(batch),
                                                                      device=scores.device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if progress is not None:
            progress(phase, step + 1, steps)
    model.eval()
    head = losses[:max(1, len(losses) // 10)]
    tail = losses[-max(1, len(losses) // 10):]
    return {"steps": steps, "batch_size": bs, "bf16": use_bf16,
            "loss_first": round(float(np.mean(head)), 4) if losses else None,
            "loss_last": round(float(np.mean(tail)), 4) if losses else None,
            "train_seconds": round(time.perf_counter() - t0, 1),
            "lr_final": sched.get_last_lr()[0] if steps else None}


def _embed(model, texts: list[str], device: str):
    import torch
    features = (model.preprocess if hasattr(model, "preprocess") else model.tokenize)(texts)
    features = {k: v.to(device) for k, v in features.items() if isinstance(v, torch.Tensor)}
    emb = model(features)["sentence_embedding"]
    return torch.nn.functional.normalize(emb, dim=-1)


def encode(model, texts: Sequence[str], device: str, batch_size: int = 64) -> np.ndarray:
    """L2-normalized float32 embeddings (for the next round's student ranks)."""
    import torch
    model.eval()
    use_bf16 = bf16_ok(device)
    with torch.autocast("cuda" if device.startswith("cuda") else "cpu", dtype=torch.bfloat16,
                        enabled=use_bf16):
        out = model.encode(list(texts), batch_size=batch_size, normalize_embeddings=True,
                           convert_to_numpy=True, show_progress_bar=False)
    return np.asarray(out, dtype=np.float32)


def average(model, base, share: float) -> None:
    """``model``'s weights moved back toward ``base``'s in place: (1 - share) x model +
    share x base (a weight-space average: keeps part of the fine-tune, less of its drift)."""
    import torch
    theirs = dict(base.named_parameters())
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.mul_(1.0 - share).add_(theirs[name].to(p.dtype), alpha=share)


def save(model, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save(str(out_dir), safe_serialization=True)


