"""Atomic file and directory writes: a reader never sees a half-written output."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

from dflash_core.errors import OutputError


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


def _missing_parents(path: Path) -> list[Path]:
    """The ancestors of `path` that do not exist yet, outermost first (a failed write removes them)."""
    missing = []
    for parent in path.parents:  # nearest first
        if os.path.lexists(parent):
            break
        missing.append(parent)
    return missing[::-1]


def _remove_created(parents: list[Path]) -> None:
    """Remove the parent folders a failed write created, innermost first, if they are still empty."""
    for parent in reversed(parents):
        with contextlib.suppress(OSError):
            parent.rmdir()


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary sibling path of `path`; on success it replaces `path`.

    On error (Ctrl-C included) it vanishes, with any parent folders created for it.
    """
    path = Path(path)
    created = _missing_parents(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        yield Path(tmp)
        # mkstemp makes 0600, and writers that replace the path they are given (safetensors' save_file)
        # make their own: give the finished file the usual permissions
        os.chmod(tmp, 0o666 & ~_umask())
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        if tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        _remove_created(created)
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


def _remove_now(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def _remove(path: Path) -> None:
    """Delete a file, link or directory tree; a Ctrl-C during it first finishes the removal, then propagates."""
    try:
        _remove_now(path)
    except BaseException:
        _remove_now(path)
        raise


def _swap_in(tmp: Path, path: Path, overwrite: bool) -> None:
    """Rename the finished `tmp` to `path`; an existing directory is moved aside and removed only after."""
    if not os.path.lexists(path):
        os.replace(tmp, path)
        return
    if not path.is_dir():
        raise OutputError(f"{path} is an existing file, expected a directory; nothing was written.")
    if not overwrite:
        raise OutputError(f"{path} already exists; nothing was written.")
    old = path.with_name(f".{path.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    os.replace(path, old)
    try:
        os.replace(tmp, path)
    except BaseException:
        os.replace(old, path)  # put the previous output back
        raise
    _remove(old)


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike, *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory next to `path`; on success it is renamed to `path`.

    With `overwrite`, an existing directory `path` is replaced only once the new one is complete; an
    existing file is never replaced. On error (Ctrl-C included) nothing is left: no temporary
    directory, no moved-aside old output, no parent folders created for `path`.
    """
    path = Path(path)
    if os.path.lexists(path) and not path.is_dir():
        raise OutputError(f"{path} is an existing file, expected a directory; nothing was written.")
    created = _missing_parents(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
        os.chmod(tmp, 0o777 & ~_umask())
        yield tmp
        _swap_in(tmp, path, overwrite)
        _fsync_dir(path.parent)
    except BaseException:
        if tmp is not None:
            _remove(tmp)
        _remove_created(created)
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
            relation = ("is the input" if resolved == source  # name the path once
                        else f"contains the input {given}" if source.is_relative_to(resolved)
                        else f"lies inside the input {given}")
            raise OutputError(f"{flag} {out} {relation}: inputs are never modified or deleted; "
                              "choose another output location.")
    if out.exists() and not out.is_dir():
        raise OutputError(f"{flag} {out} is an existing file, expected a directory (new or this command's own).")
    existing = next(parent for parent in resolved.parents if parent.exists())
    if not existing.is_dir():
        raise OutputError(f"{flag} {out} lies under {existing}, which is a file, not a directory.")
    if out.is_dir() and any(out.iterdir()) and not force and not (is_own_state and is_own_state(out)):
        raise OutputError(f"{flag} {out} already holds other files; pass --force to replace it, "
                          "or choose an empty or new directory.")
    return out
