"""TREC topic files: the classic SGML-like ``<top>`` blocks and the newer XML ``<topic>``.

Classic (TREC 1-8, Robust)::

    <top>
    <num> Number: 401
    <title> foreign minorities, Germany
    <desc> Description: ...
    </top>

XML (TREC Web/Deep Learning style)::

    <topics><topic number="1" type="faceted"><query>obama family tree</query>...</topic></topics>

The title (classic) or query (XML) is the query text, the usual choice for ad hoc runs. Tags
of the classic format are not closed, so it is read with regular expressions, not an XML
parser; the XML form goes through ``xml.etree``.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

from polyindex.errors import InputError

_TOP = re.compile(r"<top>(.*?)</top>", re.S | re.I)
_FIELD = re.compile(r"<(num|title)>(.*?)(?=<[a-z/]|\Z)", re.S | re.I)
_PREFIX = re.compile(r"^\s*(number|topic|title)\s*:\s*", re.I)


def read_trec_topics(path: Path, source: str) -> list[tuple[str, str]]:
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise InputError(f"invalid UTF-8: {e.reason}", source=source, line=line) from None
    if re.search(r"<topic[\s>]", text) and not _TOP.search(text):
        return _xml_topics(text, source)
    out = []
    for block in _TOP.finditer(text):
        line = text.count("\n", 0, block.start()) + 1
        fields = {m.group(1).lower(): " ".join(_PREFIX.sub("", m.group(2)).split())
                  for m in _FIELD.finditer(block.group(1))}
        for name in ("num", "title"):
            if not fields.get(name):
                raise InputError(f"TREC topic without <{name}>", source=source, line=line,
                                 field=name)
        out.append((fields["num"], fields["title"]))
    if not out:
        raise InputError("no <top> ... </top> topic found", source=source, line=1)
    return out


def _xml_topics(text: str, source: str) -> list[tuple[str, str]]:
    try:
        root = ET.fromstring(text)
    except ET.ParseError as e:
        raise InputError(f"malformed XML topics: {e}", source=source, line=e.position[0]) from None
    topics = [root] if root.tag == "topic" else root.iter("topic")
    out = []
    for t in topics:
        qid = (t.get("number") or t.get("id") or "").strip()
        node = t.find("query")
        if node is None:
            node = t.find("title")
        query = " ".join((node.text or "").split()) if node is not None else ""
        if not qid or not query:
            raise InputError("XML topic without a number and a <query> (or <title>)",
                             source=source, doc_id=qid or None)
        out.append((qid, query))
    if not out:
        raise InputError("no <topic> found", source=source, line=1)
    return out
