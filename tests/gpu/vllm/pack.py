"""Packs a CUDA build of vLLM for the GPU machine, which reaches no package registry and takes at
most 64 MiB per call: vLLM's wheel with the machine code for one GPU architecture only, plus every
requirement the machine's image lacks, as one .tar.xz to unpack onto PYTHONPATH there.

    python tests/gpu/vllm/pack.py --out .gpu-vllm            (what VLLM=1 tests/gpu/run.sh prepare runs)

Steps (downloads are kept in --work and reused):
  1. `pip download vllm==VERSION`: the CUDA wheel for CPython 3.12 on manylinux x86-64.
  2. Its requirements, walked transitively: a requirement whose name the image has
     (image_packages.txt) is left to the image; one in OPTIONAL is left out (GPU kernel packages
     that vLLM imports only when a backend that needs them is chosen); every other is
     downloaded as a binary wheel, newest within every specifier seen for it.
  3. The wheel unpacked; DROP removed (FlashAttention-2: the H200 runs FlashAttention-3; the
     Rust front end: `vllm serve` runs the Python one; other GPUs' kernel trees); every shared
     object with CUDA fat binaries pruned to sm_ARCH (fatbin_prune.py; no compiling).
  4. The requirements installed beside it (`pip install --target`, no index, no dependencies),
     less their data files listed in STRIP.
  5. Packed: OUT/vllm-VERSION-sm_ARCH.tar.xz, and OUT/manifest.txt (every package and version).

The next vLLM release is a change of VERSION (and of TORCH, which must be the GPU machine's) and a
re-run; a requirement that no longer resolves, or a torch pin that is not the machine's, stops
here with a message rather than there.
"""

from __future__ import annotations

import argparse
import email.parser
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name, parse_wheel_filename

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import fatbin_prune  # noqa: E402

VERSION = "0.26.0"  # the newest vLLM whose CUDA wheel pins the GPU machine's torch
TORCH = "2.11.0"  # the GPU machine's torch (2.11.0+cu130)
ARCH = 90  # H100 / H200
PYTHON = "3.12"
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (39, 38, 35, 34, 31, 28, 27, 24, 17, 5)] + [
    "manylinux2014_x86_64", "manylinux1_x86_64", "linux_x86_64"]
# The target's environment, for requirement markers.
MARKERS = {"python_version": PYTHON, "python_full_version": f"{PYTHON}.3",
           "platform_machine": "x86_64", "platform_system": "Linux", "sys_platform": "linux",
           "os_name": "posix", "implementation_name": "cpython",
           "platform_python_implementation": "CPython", "extra": ""}
# Imported only when a backend that needs them is chosen (FlashInfer attention or sampling,
# TileLang, CuTe DSL kernels, video decoding, the fastsafetensors loader ...): left out.
OPTIONAL = {"flashinfer-python", "flashinfer-cubin", "tilelang", "nvidia-cutlass-dsl",
            "quack-kernels", "tokenspeed-mla", "humming-kernels", "pynvvideocodec", "torchcodec",
            "fastsafetensors", "nvidia-cudnn-frontend", "nvidia-cutlass-dsl-libs-base"}
# Serve-only requirements (the Anthropic API and tool servers of `vllm serve`): the GPU machine
# runs the offline engine (LLM); `vllm serve` is tested on the CPU build.
OPTIONAL |= {"anthropic", "mcp"}
# Parts of the wheel the GPU machine does not run (paths under vllm/, glob patterns): the
# FlashAttention-2 build (Hopper runs FlashAttention-3), the Rust front end, other GPUs' kernel
# trees, and the MoE kernels (an optional import: the tests' models are dense; 14 MiB packed,
# which with them would not fit in one call beside the bundle).
DROP = ["vllm_flash_attn/_vllm_fa2_C.abi3.so", "vllm-rs", "third_party/deep_gemm",
        "third_party/fmha_sm100", "_qutlass_C.abi3.so", "_moe_C_stable_libtorch.abi3.so"]
# Data files of requirements that the engine never reads for the models tested (paths under the
# site folder): pycountry's translations of country names, and the Mistral tokenizer files
# bundled with mistral_common (a Mistral model brings its own).
STRIP = ["pycountry/locales", "mistral_common/data"]
# Where the registry's newest release within vLLM's range does not install on Python 3.12
# manylinux (name: the version taken instead, and why).
PINS = {
    # 1.45.3 came out alone: opentelemetry-sdk and -semantic-conventions (newest 1.45.2 and
    # 0.66b2) pin opentelemetry-api==1.45.2, which the walk above cannot back out to by itself.
    "opentelemetry-api": "1.45.2",
}


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def download(requirement: str, into: pathlib.Path) -> pathlib.Path:
    """One binary wheel for the target (no dependencies): the newest in `into` that satisfies
    `requirement` once pip has fetched it (a wheel downloaded earlier is reused)."""
    platforms = [a for p in PLATFORMS for a in ("--platform", p)]
    pip("download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", PYTHON,
        "--implementation", "cp", *platforms, "-d", str(into), requirement)
    wanted = Requirement(requirement)
    name = canonicalize_name(wanted.name)
    found = [(parse_wheel_filename(w.name)[1], w) for w in into.glob("*.whl")
             if canonicalize_name(parse_wheel_filename(w.name)[0]) == name
             and wanted.specifier.contains(parse_wheel_filename(w.name)[1], prereleases=True)]
    if not found:
        raise SystemExit(f"pack.py: pip downloaded no wheel for {requirement}")
    return max(found)[1]


def requirements_of(wheel: pathlib.Path, extras: set[str]) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        message = email.parser.Parser().parsestr(archive.read(metadata).decode())
    wanted = []
    for line in message.get_all("Requires-Dist") or []:
        requirement = Requirement(line)
        if requirement.marker is not None and not any(
                requirement.marker.evaluate({**MARKERS, "extra": e}) for e in extras | {""}):
            continue
        wanted.append(requirement)
    return wanted


def image_packages() -> set[str]:
    lines = (HERE / "image_packages.txt").read_text().splitlines()
    return {canonicalize_name(x) for x in lines if x.strip() and not x.startswith("#")}


def resolve(vllm_wheel: pathlib.Path, wheels: pathlib.Path) -> dict[str, pathlib.Path]:
    """{name: wheel} of every requirement, transitively, that the image lacks."""
    image = image_packages()
    chosen: dict[str, pathlib.Path] = {}
    specifiers: dict[str, SpecifierSet] = {}
    extras: dict[str, set[str]] = {}
    retries: dict[str, int] = {}
    queue = [(r, "vllm") for r in requirements_of(vllm_wheel, set())]
    for requirement, wanted_by in queue:
        name = canonicalize_name(requirement.name)
        if name == "torch" and not requirement.specifier.contains(TORCH, prereleases=True):
            raise SystemExit(f"pack.py: vllm {VERSION} requires {requirement}, the GPU machine "
                             f"has torch {TORCH}: choose the vLLM release built for it")
        if name in image or name in OPTIONAL:
            continue
        if name in chosen:
            version = parse_wheel_filename(chosen[name].name)[1]
            if requirement.specifier.contains(version, prereleases=True):
                added = set(requirement.extras) - extras[name]
                if added:  # asked again with extras: what they need as well
                    extras[name] |= added
                    queue += [(r, name) for r in requirements_of(chosen[name], added)]
                continue
            # An earlier choice (pinned by vLLM, say) that this package's release does not
            # accept: an older release of the package that asked is tried instead.
            if wanted_by == "vllm" or retries.get(wanted_by, 0) >= 8:
                raise SystemExit(f"pack.py: {name} {version} (for an earlier requirement) does "
                                 f"not satisfy {requirement} of {wanted_by}")
            retries[wanted_by] = retries.get(wanted_by, 0) + 1
            rejected = parse_wheel_filename(chosen.pop(wanted_by).name)[1]
            print(f"  ({wanted_by} {rejected} wants {requirement}, {name} {version} is chosen: "
                  f"an older {wanted_by})")
            specifiers[wanted_by] &= SpecifierSet(f"!={rejected}")
            queue.append((Requirement(f"{wanted_by}{specifiers[wanted_by]}"), wanted_by + "'"))
            continue
        specifiers[name] = specifiers.get(name, SpecifierSet()) & requirement.specifier
        spec = f"{name}=={PINS[name]}" if name in PINS else f"{name}{specifiers[name]}"
        wheel = download(spec, wheels)
        chosen[name] = wheel
        extras[name] = extras.get(name, set()) | set(requirement.extras)
        print(f"  {wheel.name}  (for {wanted_by.rstrip(chr(39))})")
        queue += [(r, name) for r in requirements_of(wheel, extras[name])]
    return chosen


def slim(vllm_wheel: pathlib.Path, site: pathlib.Path) -> None:
    with zipfile.ZipFile(vllm_wheel) as archive:
        archive.extractall(site)
    package = site / "vllm"
    for pattern in DROP:
        for path in package.glob(pattern):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    for library in sorted(package.rglob("*.so")):
        if fatbin_prune.fatbin_section(str(library)) is None:
            continue
        pruned = library.with_suffix(".pruned")
        stats = fatbin_prune.prune_file(str(library), str(pruned), ARCH)
        pruned.replace(library)
        print(f"  {library.relative_to(site)}: {stats['fat_binaries']} fat binaries, kept "
              f"{stats['kept_bytes'] >> 20} MiB, zeroed {stats['zeroed_bytes'] >> 20} MiB")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=pathlib.Path)
    parser.add_argument("--work", type=pathlib.Path,
                        default=pathlib.Path(os.environ.get("VLLM_PACK_WORK",
                                                            "/tmp/probe-sidecar-vllm-pack")))
    args = parser.parse_args(argv)
    wheels = args.work / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    print(f"== vllm {VERSION} (CUDA wheel, Python {PYTHON}) and the requirements the image lacks")
    vllm_wheel = download(f"vllm=={VERSION}", wheels)
    deps = resolve(vllm_wheel, wheels)
    site = args.work / "site"
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir()
    print(f"== unpacking, dropping {', '.join(DROP)}, pruning fat binaries to sm_{ARCH}")
    slim(vllm_wheel, site)
    if deps:
        platforms = [a for p in PLATFORMS for a in ("--platform", p)]
        pip("install", "-q", "--no-index", "--no-deps", "--no-compile", "--only-binary=:all:",
            "--python-version", PYTHON, "--implementation", "cp", *platforms, "--target",
            str(site), *map(str, deps.values()))
    for path in ["bin", *STRIP]:
        shutil.rmtree(site / path, ignore_errors=True)
    for cache in site.rglob("__pycache__"):
        shutil.rmtree(cache, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("vllm-*.tar.xz"):
        old.unlink()
    target = args.out / f"vllm-{VERSION}-sm_{ARCH}.tar.xz"
    print(f"== packing {target}")
    # One thread and a dictionary past the 350 MiB tarball: the carry limit is 64 MiB in all.
    env = {**os.environ, "XZ_OPT": "-T1 --lzma2=preset=9e,dict=384MiB"}
    subprocess.run(["tar", "-cJf", str(target), "-C", str(site), "."], check=True, env=env)
    manifest = [f"vllm {VERSION} (sm_{ARCH}; for torch {TORCH}, Python {PYTHON})"] + sorted(
        f"{parse_wheel_filename(w.name)[0]} {parse_wheel_filename(w.name)[1]}"
        for w in deps.values())
    (args.out / "manifest.txt").write_text("\n".join(manifest) + "\n")
    print(f"packed {target.stat().st_size / 2**20:.1f} MiB ({len(deps)} requirements beside "
          f"vllm); carry {args.out.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
