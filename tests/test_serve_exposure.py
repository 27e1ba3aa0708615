"""What a server exposes (issue 37): a host beyond loopback needs a token, TLS or
``--insecure``; a client names only the models the server offers. Nothing here binds beyond
loopback: the refusal exits before any bind, the accepted case is checked as a function."""
from __future__ import annotations

import grpc
import pytest

from polyindex.errors import InvalidArgument
from polyindex.proto.polyindex.v1 import polyindex_pb2 as pb
from polyindex.proto.polyindex.v1 import polyindex_pb2_grpc as pb_grpc
from polyindex.service.exposure import check_exposure, is_loopback
from polyindex.service.server import serve
from polyindex.wire.convert import from_struct


@pytest.mark.parametrize("extra", [[], ["--processes", "2"]])
def test_serve_beyond_loopback_without_a_token_is_refused_before_binding(tmp_path, cli, extra):
    data = tmp_path / "data"
    r = cli("serve", "--data", data, "--host", "0.0.0.0", "--port", "0", *extra, timeout=60)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("error (INVALID_ARGUMENT): --host 0.0.0.0 "), lines
    assert "--insecure" in lines[0] and "--token-file" in lines[0]
    assert not data.exists()  # refused before anything was opened or bound


def test_what_passes_the_exposure_check():
    for host in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost", "::ffff:127.0.0.1"):
        assert is_loopback(host), host
        assert check_exposure(host, token=False, tls=False, insecure=False) is None
    for host in ("0.0.0.0", "::", "", "10.1.2.3", "192.0.2.7"):
        assert not is_loopback(host), host
        with pytest.raises(InvalidArgument, match="--insecure"):
            check_exposure(host, token=False, tls=False, insecure=False)
        assert check_exposure(host, token=True, tls=False, insecure=False) is None
        assert check_exposure(host, token=False, tls=True, insecure=False) is None
        warning = check_exposure(host, token=False, tls=False, insecure=True)
        assert "warning" in warning and "--insecure" in warning and "plaintext" in warning


@pytest.fixture
def served(tmp_path, frontend):
    root = tmp_path / "models"
    (root / "mini").mkdir(parents=True)
    (root / "mini" / "config.json").write_text("{}")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "config.json").write_text("{}")
    (root / "escape").symlink_to(tmp_path / "outside")
    srv = serve(tmp_path / "data", port=0, frontend=frontend, model_root=root)
    ch = grpc.insecure_channel(srv.address)
    yield pb_grpc.PolyindexStub(ch), root
    ch.close()
    srv.stop(grace=1)


def test_create_collection_names_only_the_models_the_server_offers(served):
    stub, root = served
    for i, model in enumerate(["/etc", "/tmp", str(root / ".." / "outside"), "../outside",
                               "escape", str(root / "escape"), "no-such-model"]):
        with pytest.raises(grpc.RpcError) as e:
            stub.CreateCollection(pb.CreateCollectionRequest(name=f"c{i}", indexes=["lexical"],
                                                             model=model), timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, model
        details = e.value.details()
        assert f"model {model!r} is not offered by this server" in details
        assert "'all-MiniLM-L6-v2', 'none'" in details and "model root (mini)" in details
        assert str(root) not in details.replace(repr(model), "")  # no server path told
    names = stub.ListCollections(pb.ListCollectionsRequest(), timeout=10).names
    assert list(names) == []
    ok = {"shipped": "all-MiniLM-L6-v2", "none": "none", "folder": "mini",
          "folder-abs": str(root / "mini")}
    for name, model in ok.items():
        info = stub.CreateCollection(pb.CreateCollectionRequest(name=name, indexes=["lexical"],
                                                                model=model), timeout=10)
        got = from_struct(info.info)["model"]
        assert got == {"none": None, "folder-abs": "mini"}.get(name, model), (name, got)
    stub.CreateCollection(pb.CreateCollectionRequest(name="default", indexes=["lexical"]),
                          timeout=10)


def test_the_embedded_engine_still_takes_any_folder(tmp_path):
    import polyindex
    folder = tmp_path / "anywhere"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    with polyindex.open(tmp_path / "data") as eng:
        coll = eng.create_collection("c", ["lexical"], model=str(folder))
        assert coll.config.model == str(folder)
