"""FlashInfer's wheel cut to what its MLA decode (fa3, JIT-built for sm90a) needs, so that it fits
beside the bundle in what the device tool carries (64 MiB): 0.7.4's 101 MB wheel becomes ~20 MB.

    python3 bench/mla_verify/slim_flashinfer.py WHEEL OUT_DIR

WHEEL: flashinfer_python-<version>-py3-none-any.whl (e.g. `pip download --no-deps
flashinfer-python==0.7.4`). OUT_DIR gets a wheel of the same name, which run.sh installs with
`pip install --no-deps --target` beside apache-tvm-ffi's (take the wheel for the GPU machine's
Python: its python3 is 3.12, and pip refuses a whole install with one wheel of another tag).

Kept:
- the Python modules that the MLA entry points reach: the closure of `flashinfer`,
  `flashinfer.mla` and `flashinfer.jit` over every import, lazy ones inside functions included,
  and every string that names a module (FlashInfer loads some by name), so that it errs towards
  keeping; the data files beside kept modules;
- every header the JIT build may include (`data/include`, `data/cutlass`, `data/cccl`,
  `data/spdlog`), the top-level sources of `data/csrc` that are not `.cu` files, and its
  `*mla*.cu` (the fa3 and fa2 MLA kernels);
- the dist-info (with a RECORD made anew) and everything outside `flashinfer/`.
Dropped: other kernels' sources, the cute-dsl and AOT backends, modules nothing kept reaches.

With --check, installed alone and `flashinfer.mla.BatchMLAPagedAttentionWrapper` imported (needs
torch; --deps DIR for nvidia-ml-py and tabulate); the JIT build itself runs on the GPU machine
(checked once with nvcc 13.0 here: the fa3 module built from the slim tree in 20 s).
"""

from __future__ import annotations

import argparse
import ast
import base64
import fnmatch
import hashlib
import pathlib
import re
import subprocess
import sys
import tempfile
import zipfile

SEEDS = ("flashinfer", "flashinfer.mla", "flashinfer.jit")
HEADER_TREES = ("include", "cutlass", "cccl", "spdlog")
SOURCE_SUFFIXES = (".cu", ".cuh", ".h", ".hpp", ".inl", ".c", ".cc", ".cpp", ".ptx", ".md", ".rst")
_NAME = re.compile(r"^\.?[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def modules(site: pathlib.Path) -> dict[str, pathlib.Path]:
    """{dotted name: file} of the package's Python modules (data/ excluded)."""
    found: dict[str, pathlib.Path] = {}
    for path in (site / "flashinfer").rglob("*.py"):
        rel = path.relative_to(site)
        if rel.parts[1:2] == ("data",):
            continue
        name = ".".join(rel.with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def references(name: str, path: pathlib.Path) -> set[str]:
    """What module `name` may load: its imports (relative ones resolved) and the strings in it
    that read as module names, with every parent package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def absolute(level: int, module: str) -> str:
        if level == 0:
            return module
        parts = package.split(".")
        base = ".".join(parts[: len(parts) - (level - 1)] if level > 1 else parts)
        return f"{base}.{module}" if module else base

    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    except SyntaxError:
        return set()
    named: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = absolute(node.level, node.module or "")
            named.add(base)
            named.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if not _NAME.match(text):
                continue
            if text.startswith("."):
                named.update({absolute(1, text[1:]), package + text})
            elif "." in text:
                named.update({text, f"{package}.{text}"})
            elif len(text) > 2:
                named.add(f"{package}.{text}")  # a lazily loaded submodule's name
    with_parents: set[str] = set()
    for ref in named:
        parts = ref.split(".")
        with_parents.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return with_parents


def closure(site: pathlib.Path) -> set[str]:
    known = modules(site)
    seen: set[str] = set()
    stack = [s for s in SEEDS if s in known]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        stack.extend(r for r in references(name, known[name]) if r in known and r not in seen)
    return seen


def kept(rel: str, keep_py: set[str], kept_dirs: set[str], dist_info: str) -> bool:
    if rel.startswith(dist_info + "/"):
        return not rel.endswith("/RECORD")
    if rel.startswith("flashinfer/data/"):
        sub = rel[len("flashinfer/data/"):]
        top = sub.split("/")[0]
        if top in HEADER_TREES or "/" not in sub:
            return True
        if top == "csrc":
            leaf = sub[len("csrc/"):]
            if "/" in leaf:
                return False
            return fnmatch.fnmatch(leaf, "*mla*.cu") or not leaf.endswith((".cu", ".py"))
        return False
    if rel.startswith("flashinfer/"):
        if rel.endswith(".py"):
            return rel in keep_py
        return rel.rpartition("/")[0] in kept_dirs and not rel.endswith(SOURCE_SUFFIXES)
    return True


def record_line(rel: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{rel},sha256={digest},{len(data)}"


def slim(wheel: pathlib.Path, out_dir: pathlib.Path) -> pathlib.Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / wheel.name
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as source:
        site = pathlib.Path(tmp)
        source.extractall(site)
        dist_info = next(p.name for p in site.iterdir() if p.name.endswith(".dist-info"))
        keep_py: set[str] = set()
        for name in closure(site):
            rel = "/".join(name.split("."))
            keep_py.add(f"{rel}/__init__.py" if (site / rel).is_dir() else f"{rel}.py")
        keep_py.add("flashinfer/__main__.py")  # `python -m flashinfer`, FlashInfer's own tools
        kept_dirs = {p.rpartition("/")[0] for p in keep_py}
        names = sorted(n for n in source.namelist() if not n.endswith("/"))
        keep = [n for n in names if kept(n, keep_py, kept_dirs, dist_info)]
        record = f"{dist_info}/RECORD"
        lines = [record_line(n, (site / n).read_bytes()) for n in keep] + [f"{record},,"]
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as slimmed:
            for n in keep:
                slimmed.write(site / n, n)
            slimmed.writestr(record, "\n".join(lines) + "\n")
        print(f"{wheel.name}: kept {len(keep)} of {len(names)} files, "
              f"{wheel.stat().st_size / 2**20:.1f} -> {out.stat().st_size / 2**20:.1f} MiB")
    return out


def check(out: pathlib.Path, deps: list[pathlib.Path]) -> None:
    """Installs the slim wheel alone into a temporary target and imports the MLA wrapper, with
    `deps` on the path (FlashInfer imports nvidia-ml-py and tabulate, which the GPU machine's
    image has and a build machine may not)."""
    with tempfile.TemporaryDirectory() as target:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                        "--target", target, str(out)], check=True)
        code = ("import sys; sys.path[:0] = sys.argv[1:]; "
                "from flashinfer.mla import BatchMLAPagedAttentionWrapper; print('import ok')")
        subprocess.run([sys.executable, "-c", code, target, *map(str, deps)], check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheel", type=pathlib.Path)
    parser.add_argument("out_dir", type=pathlib.Path)
    parser.add_argument("--check", action="store_true",
                        help="install the result and import the MLA wrapper (needs torch)")
    parser.add_argument("--deps", type=pathlib.Path, action="append", default=[],
                        help="a directory of FlashInfer's other requirements for --check")
    args = parser.parse_args()
    out = slim(args.wheel, args.out_dir)
    if args.check:
        check(out, args.deps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
