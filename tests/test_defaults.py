"""README's table of defaults (index kinds, the default profile, its stages and weights,
hybrid's fusion) is what the code uses (issue 39): parsed from the README, compared with the
constants and with the profile a query resolves when it names none."""
import re
from pathlib import Path

import pytest

from polyindex.config import DEFAULT_INDEXES, CollectionConfig
from polyindex.query import profiles
from polyindex.query.profiles import builtin_profiles, default_profile, resolve_profile

README = Path(__file__).resolve().parent.parent / "README.md"


def rows() -> dict[str, str]:
    text = README.read_text()
    section = text.split("\n## Defaults\n", 1)[1].split("\n## ", 1)[0]
    out = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 2 and not set(cells[0]) <= set("-"):
            out[cells[0]] = cells[1]
    return out


def numbers(text: str, after: str) -> float:
    m = re.search(re.escape(after) + r"\s+(?:weighted\s+)?([0-9.]+)", text)
    assert m, f"README defaults: no number after {after!r} in {text!r}"
    return float(m.group(1))


def test_readme_defaults_table_is_what_the_code_uses():
    table = rows()
    kinds = re.findall(r"`([^`]+)`", table["index kinds"])
    assert tuple(kinds) == DEFAULT_INDEXES == tuple(CollectionConfig("c").indexes)

    name = re.findall(r"`([^`]+)`", table["profile of a text query"])[0]
    assert name == profiles.DEFAULT
    assert default_profile(list(kinds), builtin_profiles(list(kinds))) == name
    prof = resolve_profile(None, list(kinds), {})  # a query naming no profile
    assert prof.name == name and prof.rerank is None

    stages = table["its retrieve stages"]
    assert [s.index for s in prof.retrieve] == ["lexical", "dense"]
    for st in prof.retrieve:
        assert numbers(stages, f"{st.index} top") == st.k == profiles.CONVEX_DEPTHS[st.index]

    fusion = table["its fusion"]
    assert fusion.startswith(prof.fuse["method"])
    for kind, w in prof.fuse["weights"].items():
        assert numbers(fusion, f"{kind}") == pytest.approx(w) == profiles.CONVEX_WEIGHTS[kind]
    assert set(prof.fuse["weights"]) == {"lexical", "dense"}

    hybrid = table["`hybrid` (the reference)"]
    h = resolve_profile("hybrid", list(kinds), {})
    assert h.fuse["method"] == "rrf" and numbers(hybrid, "RRF k") == h.fuse["k"]
    assert {st.index: st.k for st in h.retrieve} == {
        "lexical": numbers(hybrid, "lexical top"), "dense": numbers(hybrid, "dense top")}
    assert numbers(hybrid, "dense") == profiles.NEURAL_WEIGHT == h.fuse["weights"]["dense"]


def test_default_falls_back_without_both_kinds():
    assert default_profile(["lexical"], builtin_profiles(["lexical"])) == "lexical"
    assert default_profile(["dense", "lexical"], {"hybrid": {}}) == "hybrid"
    kinds = ["lexical", "dense", "multivector"]
    assert default_profile(kinds, builtin_profiles(kinds)) == profiles.DEFAULT


def test_demo_shows_the_default_last():
    from polyindex.cli.demo import PROFILES
    assert PROFILES[-1] == profiles.DEFAULT and "hybrid" in PROFILES
