"""Atomic outputs: whole or not at all, on errors and Ctrl-C alike, parent folders included."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dflash_core.files import atomic as fileio
from dflash_core.errors import OutputError
from dflash_core.files.atomic import atomic_directory, atomic_file, atomic_path, guard_output


def tree(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyboardInterrupt()])
def test_failed_directory_leaves_nothing_not_even_parents(tmp_path, exc):
    (tmp_path / "a").mkdir()  # an existing parent stays; the ones created for the output go
    with pytest.raises(type(exc)):
        with atomic_directory(tmp_path / "a" / "b" / "c" / "out") as tmp:
            (tmp / "half.bin").write_bytes(b"x")
            raise exc
    assert tree(tmp_path) == {"a": None}


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyboardInterrupt()])
def test_failed_overwrite_keeps_the_old_directory(tmp_path, exc):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with pytest.raises(type(exc)):
        with atomic_directory(out, overwrite=True) as tmp:
            (tmp / "new.txt").write_text("new")
            raise exc
    assert tree(tmp_path) == {"out": None, "out/old.txt": b"old"}


def test_overwrite_replaces_and_leaves_no_old_sibling(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with atomic_directory(out, overwrite=True) as tmp:
        (tmp / "new.txt").write_text("new")
    assert tree(tmp_path) == {"out": None, "out/new.txt": b"new"}


def test_ctrl_c_while_swapping_restores_the_old_directory(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    real = os.replace

    def replace(src, dst):  # interrupted after the old output was moved aside
        if Path(src).name.endswith(".tmp"):
            raise KeyboardInterrupt
        return real(src, dst)

    monkeypatch.setattr(fileio.os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        with atomic_directory(out, overwrite=True) as tmp:
            (tmp / "new.txt").write_text("new")
    assert tree(tmp_path) == {"out": None, "out/old.txt": b"old"}


def test_ctrl_c_while_removing_the_old_directory_still_removes_it(tmp_path, monkeypatch):
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    (out / "sub" / "old.txt").write_text("old")
    real, calls = fileio.shutil.rmtree, []

    def rmtree(path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real(path, *args, **kwargs)

    monkeypatch.setattr(fileio.shutil, "rmtree", rmtree)
    with pytest.raises(KeyboardInterrupt):
        with atomic_directory(out, overwrite=True) as tmp:
            (tmp / "new.txt").write_text("new")
    assert tree(tmp_path) == {"out": None, "out/new.txt": b"new"}  # the new output is whole; no .old-*


@pytest.mark.parametrize("overwrite", [False, True])
def test_an_existing_file_is_never_replaced(tmp_path, overwrite):
    (tmp_path / "out").write_text("data")
    with pytest.raises(OutputError, match="is an existing file"):
        with atomic_directory(tmp_path / "out", overwrite=overwrite):
            pass
    assert tree(tmp_path) == {"out": b"data"}


def test_existing_directory_without_overwrite_is_refused_cleanly(tmp_path):
    (tmp_path / "out").mkdir()
    with pytest.raises(OutputError, match="already exists"):
        with atomic_directory(tmp_path / "out") as tmp:
            (tmp / "x").write_text("x")
    assert tree(tmp_path) == {"out": None}


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyboardInterrupt()])
def test_failed_file_leaves_nothing_not_even_parents(tmp_path, exc):
    with pytest.raises(type(exc)):
        with atomic_file(tmp_path / "a" / "b" / "f.txt", "w") as handle:
            handle.write("half")
            raise exc
    assert tree(tmp_path) == {}
    with pytest.raises(type(exc)):
        with atomic_path(tmp_path / "g.bin") as tmp:
            tmp.write_bytes(b"half")
            raise exc
    assert tree(tmp_path) == {}


def test_guard_refuses_an_output_under_a_file(tmp_path):
    (tmp_path / "file").write_text("data")
    with pytest.raises(OutputError, match="which is a file"):
        guard_output(tmp_path / "file" / "sub", [])
    with pytest.raises(OutputError, match="is the input:"):
        guard_output(tmp_path / "in", [tmp_path / "in"], force=True)


def test_written_files_get_the_usual_permissions_even_when_the_writer_replaces_the_temp(tmp_path):
    """safetensors' save_file replaces the path it is given with a file of its own (0600 here); the
    finished output still gets 0666 minus the umask, like any file the user writes."""
    import torch
    from safetensors.torch import save_file

    umask = os.umask(0o022)
    try:
        with atomic_path(tmp_path / "weights.safetensors") as tmp:
            save_file({"w": torch.zeros(2)}, str(tmp))
        with atomic_file(tmp_path / "notes.txt", "w") as handle:
            handle.write("x")
    finally:
        os.umask(umask)
    assert (tmp_path / "weights.safetensors").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "notes.txt").stat().st_mode & 0o777 == 0o644
