"""Builds probe_sidecar with its gRPC stubs generated from the repository's proto/ directory.

The stubs are generated here, at build/install time, by grpcio-tools; they are never committed.
They land in the package ``probesidecar.v1`` (named after the proto package), beside
``probe_sidecar``.
"""

import os
import pathlib

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent


def _proto_root() -> pathlib.Path:
    root = pathlib.Path(os.environ.get(
        "PROBE_SIDECAR_PROTO_DIR",
        os.environ.get("PROBESIDECAR_PROTO_DIR", HERE.parent.parent / "proto")))
    if not (root / "probesidecar" / "v1" / "sidecar.proto").is_file():
        raise RuntimeError(
            f"probe_sidecar: cannot find the API protos under {root}; build from the repository "
            "checkout or set PROBE_SIDECAR_PROTO_DIR"
        )
    return root


def generate_stubs(out_dir: pathlib.Path) -> None:
    import grpc_tools
    from grpc_tools import protoc

    root = _proto_root()
    protos = sorted(str(p.relative_to(root)) for p in (root / "probesidecar" / "v1").glob("*.proto"))
    out_dir.mkdir(parents=True, exist_ok=True)
    well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{root}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError("probe_sidecar: grpc_tools.protoc failed: " + " ".join(args))
    for package in (out_dir / "probesidecar", out_dir / "probesidecar" / "v1"):
        (package / "__init__.py").touch()


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        generate_stubs(pathlib.Path(self.build_lib))


setup(cmdclass={"build_py": BuildPyWithStubs})
