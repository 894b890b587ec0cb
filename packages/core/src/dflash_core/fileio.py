"""Atomic file and directory writes: a reader never sees a half-written output."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

from .errors import OutputError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary sibling path of `path`; on success it replaces `path`, on error it vanishes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the usual permissions
    try:
        yield Path(tmp)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "wb") -> Iterator[Any]:
    """Open a temporary sibling of `path` for writing; on success it replaces `path`."""
    with atomic_path(path) as tmp, open(tmp, mode) as handle:
        yield handle


def _hash_into(digest, path: str | os.PathLike) -> None:
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    _hash_into(digest, path)
    return digest.hexdigest()


def sha256_files(paths: list[Path]) -> str:
    """One hex sha256 over several files: each file's name then its bytes, in name order."""
    digest = hashlib.sha256()
    for path in sorted(set(paths)):
        digest.update(Path(path).name.encode())
        _hash_into(digest, path)
    return digest.hexdigest()


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write `obj` as indented JSON, atomically."""
    with atomic_file(path, "w") as handle:
        json.dump(obj, handle, indent=2, sort_keys=False)
        handle.write("\n")


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike, *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory next to `path`; on success it is renamed to `path`.

    With `overwrite`, an existing `path` is replaced only once the new one is complete.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    os.chmod(tmp, 0o777 & ~_umask())
    try:
        yield tmp
        if path.exists():
            if not overwrite:
                raise FileExistsError(f"{path} already exists")
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def guard_output(out: str | os.PathLike, inputs: list[str | os.PathLike], *, flag: str = "--out",
                 force: bool = False, is_own_state: Callable[[Path], bool] | None = None) -> Path:
    """Refuse an output location that would modify or delete an input, or clobber unrelated data.

    - `out` that is, contains or lies inside any of `inputs` is refused, `force` or not;
    - `out` naming an existing file (not a directory) is refused;
    - an existing non-empty `out` is accepted only when `is_own_state(out)` says it holds this
      command's own resumable state, or with `force`.
    Raises OutputError (one line naming the flag and path); returns `out` as given.
    """
    out = Path(out)
    resolved = out.resolve()
    for given in inputs:
        source = Path(given).resolve()
        if resolved == source or source.is_relative_to(resolved) or resolved.is_relative_to(source):
            relation = "is" if resolved == source else ("contains" if source.is_relative_to(resolved) else "lies inside")
            raise OutputError(f"{flag} {out} {relation} the input {given}: inputs are never modified or deleted; "
                              "choose another output location.")
    if out.exists() and not out.is_dir():
        raise OutputError(f"{flag} {out} is an existing file, expected a directory (new or this command's own).")
    if out.is_dir() and any(out.iterdir()) and not force and not (is_own_state and is_own_state(out)):
        raise OutputError(f"{flag} {out} already holds other files; pass --force to replace it, "
                          "or choose an empty or new directory.")
    return out
