"""The model's precision of a new collection chosen by the hardware (issue 41 part 5):
bfloat16 where it is native (a GPU, a CPU with AVX-512 BF16 or AMX), else float32; stored
with the collection, reported by ``info``, overridden by ``--dtype``."""
from __future__ import annotations

import json

import numpy as np
import pytest

import polyindex
from polyindex.encode import precision
from polyindex.errors import InvalidArgument

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
flags\t\t: fpu vme sse2 avx avx2 fma avx512f {extra}
bugs\t\t: spectre_v1
"""


def test_flags_are_read_from_cpuinfo_and_pick_the_dtype():
    assert precision.cpu_flags(CPUINFO.format(extra="")) >= {"avx2", "avx512f"}
    assert precision.cpu_flags("processor : 0\n") is None  # no flags line: unknown
    avx2 = precision.cpu_flags(CPUINFO.format(extra=""))
    assert precision.choose("cpu", avx2)[0] == "float32"
    for flag in ("avx512_bf16", "amx_bf16"):
        dtype, why = precision.choose("cpu", precision.cpu_flags(CPUINFO.format(extra=flag)))
        assert dtype == "bfloat16" and flag in why
    assert precision.choose("cuda", avx2) == ("bfloat16", "auto: cuda runs bfloat16 natively")


def test_a_given_dtype_wins_and_a_bad_one_is_refused():
    assert precision.resolve("float16") == ("float16", "given")
    assert precision.resolve(None) == precision.resolve("auto") == precision.choose("cpu")
    with pytest.raises(InvalidArgument, match="dtype must be auto, bfloat16"):
        precision.resolve("float8")


def test_a_new_collection_stores_this_machines_choice(eng):
    coll = eng.create_collection("a", ["lexical"])
    want, why = precision.choose("cpu")
    assert (coll.config.dtype, coll.config.dtype_choice) == (want, why)
    assert why.startswith("auto: ")
    info = coll.info()
    assert info["dtype"] == want and info["dtype_choice"] == why
    given = eng.create_collection("b", ["lexical"], dtype="float32")
    assert (given.config.dtype, given.config.dtype_choice) == ("float32", "given")
    # stored: a reopened engine reads the choice back, never chooses again
    path = eng.path
    eng.close()
    again = polyindex.open(path, readonly=True)
    assert again.collection("a").config.dtype_choice == why
    again.close()


def test_info_reports_the_dtype_and_why(tmp_path, cli):
    src = tmp_path / "d.jsonl"
    src.write_text('{"_id": "a", "text": "ok"}\n')
    data = tmp_path / "D"
    assert cli("index", src, "--data", data, "-c", "c", "--index", "lexical", "--dtype", "auto",
               "--no-progress").returncode == 0
    res = cli("info", "--data", data, "-c", "c", "--json")
    info = json.loads(res.stdout)
    assert (info["dtype"], info["dtype_choice"]) == precision.choose("cpu")
    # --dtype auto on an existing collection is no change, whatever it chose
    assert cli("index", src, "--data", data, "-c", "c", "--dtype", "auto", "--force",
               "--no-progress").returncode == 0


@pytest.mark.slow
def test_bfloat16_and_float32_embeddings_are_comparable():
    """Why the choice may differ between machines: the tour's claim, cosine >= 0.9999
    between the two precisions' embeddings of the same text (so a collection's stored
    vectors stay comparable with queries encoded either way)."""
    from polyindex.encode.text import Encoder
    texts = ["the boundary layer of a flat plate in supersonic flow",
             "heat transfer to a cylinder", "what is the lift of a slender wing?",
             "experimental results for turbulent skin friction at high mach numbers " * 4]
    a = Encoder("all-MiniLM-L6-v2", "bfloat16").encode(texts)
    b = Encoder("all-MiniLM-L6-v2", "float32").encode(texts)
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cos.min() >= 0.9999, cos
