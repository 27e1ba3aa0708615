"""Which evaluated profiles are in-sample: a shipped ranker trained on the collection's own
judgements (the shipped ``general`` ranker saw the ten shared collections' qrels), so that
no one reads its score there as a result."""
from __future__ import annotations

from pathlib import Path


def identities(coll) -> set[str]:
    """The names a training run may have used for this collection: its own name and the
    folder its bulk ingest read (``.../cranfield/corpus.jsonl`` -> ``cranfield``)."""
    names = {coll.name}
    source = ((coll.view().manifest.ingest or {}).get("source") or {}).get("path")
    if source:
        path = Path(source)
        names.add((path.parent if path.suffix or path.is_file() else path).name)
    return names


def in_sample(coll, profiles) -> dict[str, dict]:
    """``{profile: {"model": NAME, "trained_on": [collections]}}`` for each profile whose
    rerank stage is a shipped ranker trained on this collection (a ranker the collection
    trained itself is its user's business: it may have held out the test queries)."""
    from polyindex.rerank.registry import artifact_name, resolve, shipped_names
    snap = coll.view()
    mine = identities(coll)
    out = {}
    for name in profiles:
        model = (coll._profile(name).rerank or {}).get("model")
        if model is None or model not in shipped_names() \
                or snap.manifest.artifacts.get(artifact_name(model)):
            continue
        trained = list(resolve(snap, model).meta.get("collections") or [])
        if mine & set(trained):
            out[name] = {"model": model, "trained_on": trained}
    return out
