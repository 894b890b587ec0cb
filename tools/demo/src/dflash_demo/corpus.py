"""The demo corpus: the Python standard library's own source, split by file.

Every machine ships it, so the demo models can be rebuilt anywhere without a model hub.
The split is a hash of each file's relative path, so it is the same on every machine.
Test files go to training only; the held-out split holds library code alone.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

TEST_DIR_NAMES = frozenset({"test", "tests", "idle_test"})
SKIPPED_DIR_NAMES = frozenset({"site-packages", "__pycache__"})


@dataclass(frozen=True)
class CorpusSplit:
    """Relative paths of the train and held-out files, and the root they are relative to."""

    root: Path
    train: tuple[str, ...]
    heldout: tuple[str, ...]

    def read(self, rel: str) -> str:
        return (self.root / rel).read_text(encoding="utf-8", errors="replace")


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_test_file(rel: str) -> bool:
    parts = Path(rel).parts
    return any(p in TEST_DIR_NAMES for p in parts[:-1]) or parts[-1].startswith("test_")


def list_sources(root: Path) -> list[str]:
    files = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if any(p in SKIPPED_DIR_NAMES for p in rel.parts):
            continue
        files.append(rel.as_posix())
    return sorted(files)


def _bucket(rel: str) -> int:
    return int(hashlib.sha1(rel.encode()).hexdigest(), 16) % 1000


def split_corpus(root: Path | None = None, heldout_permille: int = 50) -> CorpusSplit:
    """Split by file: about `heldout_permille`/1000 of the non-test files are held out."""
    root = root or stdlib_root()
    files = list_sources(root)
    heldout = tuple(f for f in files if not is_test_file(f) and _bucket(f) < heldout_permille)
    held = set(heldout)
    train = tuple(f for f in files if f not in held)
    return CorpusSplit(root=root, train=train, heldout=heldout)
