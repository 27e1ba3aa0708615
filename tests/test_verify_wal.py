"""``polyindex verify`` checks the write-ahead log, reading only (issue 37, defect 4): a
corrupt WAL fails it naming the file; a torn tail (a crash mid-append) is reported, not
failed, and neither is cut or rewritten."""
from __future__ import annotations

import shutil

import polyindex
from polyindex.online.wal import HEADER
from polyindex.online.wal_check import check_wal
from polyindex.storage.verify import verify_data


def crash_image(tmp_path, batches: int = 5):
    """A data directory as a kill -9 leaves it: acknowledged writes in the WAL, unsealed
    (the collection folder is copied while the writer still holds it open)."""
    live = tmp_path / "live"
    image = tmp_path / "image"
    with polyindex.open(live, online=True) as eng:
        coll = eng.create_collection("c", ["lexical"])
        coll.live.writes.seal_docs = coll.live.writes.seal_seconds = 10**9
        for b in range(batches):
            coll.add([{"id": f"b{b}-{i}", "text": f"alpha {b} {i}"} for i in range(3)])
        image.mkdir()
        shutil.copytree(coll.folder, image / "c")
    return image, image / "c" / "wal" / "wal-00000001.log"


def frame_offsets(data: bytes) -> list[int]:
    out, pos = [], 0
    while pos < len(data):
        out.append(pos)
        pos += HEADER.size + HEADER.unpack_from(data, pos)[1]
    return out


def test_verify_fails_on_a_corrupt_wal_and_names_the_file(tmp_path, cli):
    image, wal = crash_image(tmp_path)
    data = bytearray(wal.read_bytes())
    second = frame_offsets(bytes(data))[1]
    data[second + HEADER.size + 5] ^= 0x20  # one byte inside an older record's payload
    wal.write_bytes(bytes(data))
    res = cli("verify", "--data", image)
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"{wal}: checksum mismatch at byte {second}" in res.stdout
    report = verify_data(image, wal=check_wal)[0].to_json()
    assert not report["ok"] and [p["file"] for p in report["problems"]] == [str(wal)]
    assert wal.read_bytes() == bytes(data)  # nothing cut or rewritten
    assert not (wal.parent / "torn").exists()


def test_verify_reports_a_torn_wal_tail_and_exits_0(tmp_path, cli):
    image, wal = crash_image(tmp_path)
    whole = wal.read_bytes()
    torn = whole + whole[:HEADER.size + 4]  # a crash mid-append: half a frame at the end
    wal.write_bytes(torn)
    report = verify_data(image, wal=check_wal)[0].to_json()
    assert report["ok"] and report["wal_checked"]
    assert report["wal"] == [{"file": str(wal), "size": len(torn), "unsealed_records": 5,
                              "torn_tail_at": len(whole)}]
    res = cli("verify", "--data", image)
    assert res.returncode == 0 and f"{wal}: torn tail at byte {len(whole)}" in res.stdout
    assert wal.read_bytes() == torn  # verify never cuts: the writer does, keeping the bytes
    assert not (wal.parent / "torn").exists()
