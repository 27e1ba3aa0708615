"""The options several commands share, and how a command opens a data directory."""
from __future__ import annotations

from pathlib import Path

import typer

DataOpt = typer.Option(..., "--data", help="Data directory holding the collections.")
CollOpt = typer.Option(..., "--collection", "-c", help="Collection name.")
JsonOpt = typer.Option(False, "--json", help="Print JSON (for programs) instead of a table.")
PROFILES_HELP = ("Rank profile: a kind the collection has (lexical, dense, multivector, sparse, "
                 "tree), hybrid or ltr (lexical + dense), hybrid-mv, hybrid-sparse, "
                 "hybrid-tree, or one the collection stores (see `polyindex info`). "
                 "Default: hybrid when the collection has lexical and dense, else its first kind.")


DeviceOpt = typer.Option("cpu", "--device", help="cpu or cuda: where encoding and scoring run (cuda: an NVIDIA GPU, torch kernels of polyindex.cuda, faiss-gpu when installed).")


def open_engine(data: Path, readonly: bool = False, create: bool = True, device: str = "cpu"):
    """A writing engine (holds the data directory's lock) or, for commands that only read,
    a read-only one: those work beside a running server and never create the directory
    (a missing one is NotFound)."""
    from polyindex.engine import Engine
    return Engine(data, readonly=readonly, create=create, device=device)
