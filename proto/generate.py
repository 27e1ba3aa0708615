"""Regenerate the committed Python stubs of the .proto files: ``python proto/generate.py``.

Runs ``python -m grpc_tools.protoc`` (from grpcio-tools) and rewrites the imports protoc emits
(``from polyindex.v1 import ...``) to the installed package path (``polyindex.proto.polyindex.v1``).
``tests/test_grpc.py`` regenerates into a temporary folder and compares, so stubs never drift.
"""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent
PROTOS = ["polyindex/v1/polyindex.proto"]
STUBS = ["polyindex/v1/polyindex_pb2.py", "polyindex/v1/polyindex_pb2_grpc.py",
         "polyindex/v1/polyindex_pb2.pyi"]
_IMPORT = re.compile(r"^from polyindex\.v1 import ", re.M)


def generate(out: Path) -> list[Path]:
    """Write the stubs under ``out`` (same relative paths as in this folder); return them."""
    import grpc_tools
    include = Path(grpc_tools.__file__).parent / "_proto"  # google/protobuf/*.proto
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_ROOT}",
                        f"-I{include}", f"--python_out={tmp}", f"--pyi_out={tmp}",
                        f"--grpc_python_out={tmp}", *PROTOS], check=True, cwd=PROTO_ROOT)
        written = []
        for rel in STUBS:
            text = (Path(tmp) / rel).read_text()
            dest = out / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(_IMPORT.sub("from polyindex.proto.polyindex.v1 import ", text))
            written.append(dest)
    return written


if __name__ == "__main__":
    for path in generate(PROTO_ROOT):
        print(path.relative_to(PROTO_ROOT))
