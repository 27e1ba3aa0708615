"""The multivector kind's factory string (``multivector[:KMeans<K>][,OPTIONS]``, see
``polyindex.index.multivector.kind``) parsed and checked into its configuration."""
from __future__ import annotations

from polyindex.errors import InvalidArgument, ResourceExhausted
from polyindex.index.protocol import option, parse_options
from polyindex.config import index_memory_bytes
from polyindex.types import MAX_VECTOR_DIMS

DEFAULTS = {"k": 4096, "m": 32, "opq": True, "opq_dim": 0, "prune": 1.0, "bits": 0,
            "special": "drop", "seed": 0, "niter": 4, "nprobe": 4, "ncandidates": 2048, "tcs": 0.45,
            "ndocs": 256}  # depths chosen on medline, cranfield, nfcorpus (notes/multivector)


def parse(body: str) -> dict:
    where = f"index factory string {('multivector:' + body) if body else 'multivector'!r}"
    parts = [p.strip() for p in (body or "").split(",") if p.strip()]
    cfg = dict(DEFAULTS)
    if parts and "=" not in parts[0] and parts[0] != "binary":
        head = parts.pop(0)
        if not head.lower().startswith("kmeans") or not head[6:].isdigit():
            raise InvalidArgument(f"{where}: expected KMeans<K> (e.g. KMeans4096), got {head!r}")
        cfg["k"] = int(head[6:])
    if "binary" in parts:
        parts.remove("binary")
        cfg["bits"] = 64
    opts = parse_options(",".join(parts), where=where)
    known = {"residual", "prune", "binary", "special", "seed", "niter", "nprobe", "ncandidates",
             "tcs", "ndocs", "source", "dim"}
    unknown = sorted(set(opts) - known)
    if unknown:
        raise InvalidArgument(f"{where}: unknown option(s) {', '.join(unknown)}; the multivector "
                              f"index knows {', '.join(sorted(known))}")
    res = opts.get("residual", f"OPQ{cfg['m']}").upper()
    cfg["opq"] = res.startswith("OPQ")
    m_text, _, dim_text = (res[3:] if cfg["opq"] else res[2:]).partition("_")
    if res == "NONE":
        cfg["m"], cfg["opq"] = 0, False
    elif res.startswith(("PQ", "OPQ")) and m_text.isdigit() and int(m_text) > 0 \
            and (not dim_text or (cfg["opq"] and dim_text.isdigit() and int(dim_text) > 0)):
        cfg["m"], cfg["opq_dim"] = int(m_text), int(dim_text or 0)
    else:
        raise InvalidArgument(f"{where}: residual must be OPQ<M>[_<D>] (e.g. OPQ32, OPQ40_320: "
                              f"rotated and reduced to D dimensions), PQ<M> or none, "
                              f"got {opts['residual']!r}")
    cfg["prune"] = option(opts, "prune", float, 1.0, where=where)
    cfg["bits"] = option(opts, "binary", int, cfg["bits"], where=where)
    for key in ("seed", "niter", "nprobe", "ncandidates", "ndocs"):
        cfg[key] = option(opts, key, int, cfg[key], where=where)
    cfg["tcs"] = option(opts, "tcs", float, cfg["tcs"], where=where)
    if not -1e6 < cfg["tcs"] < 1e6:
        raise InvalidArgument(f"{where}: tcs (the pruned pass's centroid score threshold) must "
                              f"be a finite number, got {cfg['tcs']}")
    cfg["special"] = opts.get("special", "drop")
    cfg["source"] = opts.get("source", "model")
    if cfg["source"] not in ("model", "user"):
        raise InvalidArgument(f"{where}: source must be model or user, got {cfg['source']!r}")
    cfg["dim"] = option(opts, "dim", int, None, where=where)
    if cfg["dim"] is not None and not 1 <= cfg["dim"] <= 65_536:
        raise InvalidArgument(f"{where}: dim must be in 1..65536, got {cfg['dim']}")
    if cfg["dim"] is not None and cfg["source"] != "user":
        raise InvalidArgument(f"{where}: dim is for source=user (the model's tokens have the "
                              "model's dimension)")
    checks = (("k", 2, 65536), ("m", 0, 256), ("opq_dim", 0, MAX_VECTOR_DIMS), ("bits", 0, 64), ("seed", 0, 2**31 - 1),
              ("niter", 1, 1000), ("nprobe", 1, 65536), ("ncandidates", 0, 10_000_000),
              ("ndocs", 1, 1_000_000))
    for key, lo, hi in checks:
        if not lo <= cfg[key] <= hi:
            raise InvalidArgument(f"{where}: {key} must be in {lo}..{hi}, got {cfg[key]}")
    if "binary" in opts and cfg["bits"] < 1:
        raise InvalidArgument(f"{where}: binary=B needs B in 1..64, got {cfg['bits']}")
    if not 0 < cfg["prune"] <= 1:
        raise InvalidArgument(f"{where}: prune is the fraction of tokens kept, in (0, 1], "
                              f"got {cfg['prune']}")
    if cfg["special"] not in ("drop", "keep"):
        raise InvalidArgument(f"{where}: special must be drop or keep, got {cfg['special']!r}")
    if cfg["dim"] is not None:
        check_memory(cfg, cfg["dim"], where)
    return cfg


def check_memory(cfg: dict, dim: int, where: str) -> None:
    """The codebook (K centroids) and the residual rotation at ``dim`` within the index
    memory budget, before training allocates them."""
    d_res = cfg["opq_dim"] or dim
    cost = {f"KMeans{cfg['k']}": cfg["k"] * dim * 4,
            f"residual OPQ{cfg['m']}": dim * d_res * 4 if cfg["opq"] else 0}
    worst = max(cost, key=cost.get)
    if sum(cost.values()) > (budget := index_memory_bytes()):
        raise ResourceExhausted(f"{where}: {worst} would take {cost[worst] / 2**20:,.0f} MB at "
                                f"dimension {dim} (the index memory budget is "
                                f"{budget / 2**20:,.0f} MB, POLYINDEX_INDEX_MEMORY_MB)")
