"""What a remote client sees of the server's file system: names inside the data directory.

Error messages and collection info are written for the embedded engine, where naming a file
by its absolute path helps. Over the wire the data directory becomes ``<data>`` (a damaged
file is still named, relative to it) and a bulk-indexed source file is named by its base name.

Only whole path tokens are replaced, never a substring of a word: with ``serve --data d`` a
message reading "not found (have: named, ...)" must keep its words. An absolute spelling is
replaced where it stands alone or begins a longer path; a relative one (``d``, ``data``: a
word as much as a path) only where it begins a path inside it (``d/docs/manifest.json``).
"""
from __future__ import annotations

import copy
import os
import re
from pathlib import Path

from polyindex.errors import InputError, PolyindexError

DATA = "<data>"
SNAPSHOTS = "<snapshots>"  # ``serve --snapshot-root``
# A path token starts after none of these (a word, a longer path's earlier part; an absolute
# one may follow a '/': file:///srv/d) ...
_NOT_AFTER = r"(?<![\w.~-])"
# ... and ends at a separator, the text's end, or a character no name continues with (a
# sentence's full stop counts: "in /srv/d." but not "/srv/d.bak")
_ENDS = r"(?=/|$|\.(?![\w-])|[^\w.-])"


def _token(root: str) -> re.Pattern:
    if os.path.isabs(root):
        return re.compile(_NOT_AFTER + re.escape(root) + _ENDS)
    return re.compile(_NOT_AFTER + r"(?<!/)" + re.escape(root) + r"(?=/)")


class Redactor:
    def __init__(self, data_dir: str | Path, snapshot_root: str | Path | None = None):
        named = {}
        for folder, name in ((snapshot_root, SNAPSHOTS), (data_dir, DATA)):
            if folder is not None:
                path = Path(folder)
                named.update({s: name for s in (str(path), str(path.absolute()),
                                                os.path.realpath(path))})
        # Longest first, so /srv/data/x is not half-replaced by a shorter spelling's match
        roots = sorted((s for s in named if s not in ("", ".")), key=len, reverse=True)
        self._tokens = [(_token(root), named[root]) for root in roots]

    def text(self, message: str) -> str:
        for token, name in self._tokens:
            message = token.sub(name, message)
        return message

    def error(self, exc: PolyindexError) -> PolyindexError:
        """The same exception class with the server's paths taken out of its message."""
        if isinstance(exc, InputError):
            source = None if exc.source is None else self.text(exc.source)
            if source == exc.source and self.text(exc.reason) == exc.reason:
                return exc
            return InputError(self.text(exc.reason), source=source, line=exc.line,
                              field=exc.field, doc_id=exc.doc_id)
        message = str(exc)
        clean = self.text(message)
        if clean == message:
            return exc
        out = copy.copy(exc)
        out.args = (clean,)
        return out

    def info(self, info: dict) -> dict:
        """``Collection.info()`` for a remote client: the ingest source by its file name, a
        model given as a server folder by the folder's name."""
        info = copy.deepcopy(info)
        source = (info.get("ingest") or {}).get("source")
        if isinstance(source, dict) and isinstance(source.get("path"), str):
            source["path"] = Path(source["path"]).name
        model = info.get("model")
        if isinstance(model, str) and os.sep in model and Path(model).is_absolute():
            info["model"] = Path(model).name
        return info
