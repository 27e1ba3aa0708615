"""The server's text models: which a remote client may name, and loading them before queries.

- **Which** (``ModelPolicy``): ``CreateCollection``'s ``model`` names a model this server
  ships (all-MiniLM-L6-v2), one a collection it was started with uses, ``none``, or a folder
  under ``serve --model-root DIR`` (resolved: no ``..`` or symlink leads out of it). Any other
  server path is refused: a client must not make the server read what it likes. The embedded
  engine still takes any local folder.
- **Loading** (``ModelLoader``): a model loads in 20-40 s on a small CPU, past a client's
  default deadline, so the server loads every served collection's model when it starts, in
  a thread (the port comes up at once; health answers NOT_SERVING until every model is ready,
  then SERVING), and a new collection's at its creation. A query that comes first waits for
  the load (``encode.text.get_encoder`` loads each model once, under a lock). A model that
  fails to load is logged and health still turns SERVING: that collection's queries say why,
  the others serve.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from polyindex.config import DEFAULT_MODEL
from polyindex.errors import InvalidArgument, PolyindexError

SHIPPED = (DEFAULT_MODEL, "sentence-transformers/all-MiniLM-L6-v2")
_LISTED = 20  # folders under the model root named in an error


def say(message: str) -> None:
    print(f"polyindex: {message}", file=sys.stderr, flush=True)


def collection_models(engine) -> dict[str, list]:
    """model -> the served collections that encode text with it (opened here)."""
    out: dict[str, list] = {}
    for name in engine.list_collections():
        try:
            coll = engine.collection(name)
            model = getattr(coll.config, "model", None)
        except PolyindexError:  # dropped meanwhile, or damaged: its queries say so
            continue
        if model is not None:
            out.setdefault(model, []).append(coll)
    return out


class ModelPolicy:
    """``served``: model -> collections, as ``collection_models`` gives; ``loader`` loads a
    new collection's model when it is created."""

    def __init__(self, served: dict[str, list], root=None, loader: "ModelLoader | None" = None):
        self.names = set(SHIPPED) | set(served)
        self.root = Path(root).resolve() if root is not None else None
        self.loader = loader
        if self.root is not None and not self.root.is_dir():
            raise InvalidArgument(f"--model-root {root} is not a directory")

    def created(self, coll) -> None:
        if self.loader is not None:
            self.loader.created(coll)

    def check(self, model: str) -> str:
        """The model to create a collection with (a folder under the root: resolved)."""
        if model in self.names:
            return model
        if self.root is not None and model:
            path = (self.root / model).resolve()  # an absolute model replaces the root
            if path != self.root and path.is_relative_to(self.root) and path.is_dir():
                return str(path)
        offered = sorted(n for n in self.names if os.sep not in n)
        text = f"model {model!r} is not offered by this server: give one of " + \
            ", ".join(repr(n) for n in [*offered, "none"])
        if self.root is not None:
            folders = sorted(p.name for p in self.root.iterdir()
                             if p.is_dir() and p.resolve().is_relative_to(self.root))
            shown = ", ".join(folders[:_LISTED]) + (", ..." if len(folders) > _LISTED else "")
            text += f", or a folder under the server's model root ({shown or 'none there'})"
        else:
            text += " (a server offers local folders only under `serve --model-root DIR`)"
        raise InvalidArgument(text)


def _needs_model(coll) -> bool:
    """Whether text queries on ``coll`` run its model here (an embedded collection; a
    shard's model loads in its Ray actor). ``encoder`` is a property that loads the model:
    looked up on the class."""
    kinds = getattr(coll, "kinds", None)
    return bool(kinds) and hasattr(type(coll), "encoder") and \
        any(k.needs_embeddings or k.needs_tokens for k in kinds.values())


def load(model: str, colls: list, log: Callable[[str], None] = say) -> None:
    """Load ``model`` for ``colls`` (one shared copy) and run it once (its first call
    initialises torch's kernels: the first query pays nothing of it)."""
    log(f"loading model {model} for collections {', '.join(c.name for c in colls)}")
    start = time.perf_counter()
    try:
        for coll in colls:
            coll.encoder.encode(["polyindex"])
    except Exception as e:  # noqa: BLE001 - the queries that need it report it too
        log(f"model {model} did not load: {type(e).__name__}: {e}")
        return
    log(f"model {model} ready in {time.perf_counter() - start:.1f} s")


class ModelLoader:
    """Loads the served collections' models in a thread; ``ready`` once every one is."""

    def __init__(self, served: dict[str, list], log: Callable[[str], None] = say):
        self.log = log
        self.ready = threading.Event()
        models = {m: [c for c in cs if _needs_model(c)] for m, cs in served.items()}
        self.models = {m: cs for m, cs in models.items() if cs}
        if not self.models:
            self.ready.set()

    def start(self, on_ready: Callable[[], None]) -> None:
        threading.Thread(target=self._run, args=(on_ready,), name="model-load",
                         daemon=True).start()

    def _run(self, on_ready) -> None:
        for model, colls in self.models.items():
            load(model, colls, self.log)
        self.ready.set()
        on_ready()

    def created(self, coll) -> None:
        """A collection created while serving: its model loads now, beside the calls."""
        model = getattr(coll.config, "model", None)
        if model is not None and _needs_model(coll):
            threading.Thread(target=load, args=(model, [coll], self.log), name="model-load",
                             daemon=True).start()
