"""dflash-convert on bad input: one line on stderr, the expected exit status, and nothing on disk changed.

Each row of `convert_cases.CASES` copies a good tiny pair into its own directory, breaks one thing and
runs the converter in process. Every file and folder under that directory (the inputs, and everything
beside --out) must be byte-for-byte the same afterwards: no output, no temporary or `.old-*` sibling,
no parent folder created for --out.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from bad_input.convert_cases import CASES, Case
from bad_input.corrupt import snapshot
from tiny import save_tiny_pair

from dflash_convert.cli import main


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("pair"), block_size=8, drafter_layers=2)


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse
        code = exc.code
    return code, capsys.readouterr().err


def message_lines(err: str) -> list[str]:
    """stderr without tqdm's progress redraws (which end in a carriage return, not a newline)."""
    return [line for line in re.split(r"[\r\n]", err) if line.strip() and "%|" not in line]


def param(case: Case):
    marks = [pytest.mark.xfail(reason=case.pending, strict=False)] if case.pending else []
    return pytest.param(case, id=case.id, marks=marks)


@pytest.mark.parametrize("case", [param(case) for case in CASES])
def test_bad_input(case: Case, pair, tmp_path, capsys, monkeypatch):
    target, drafter = pair
    root = tmp_path / "case"
    shutil.copytree(drafter, root / "drafter")
    shutil.copytree(target, root / "target")
    if case.build:
        case.build(root)
    places = {"drafter": root / "drafter", "target": root / "target", "state": root / "run" / "train_state",
              "root": root, "out": root / "new" / "out"}
    argv = [arg.format(**places) for arg in case.argv]
    before = snapshot(root)
    if case.patch:
        case.patch(monkeypatch)

    code, err = run_cli(argv, capsys)

    lines = message_lines(err)
    assert code == case.code, err
    assert len(lines) == 1 and lines[0].startswith("dflash-convert: "), err
    assert case.fragment in lines[0], err
    assert "Traceback" not in err
    paths = re.findall(r"/\S*[\w/]", lines[0])
    assert len(paths) == len(set(paths)), f"a path is named twice: {lines[0]}"
    assert snapshot(root) == before  # inputs untouched, nothing left beside --out


def test_debug_reraises_an_internal_error(pair, tmp_path, monkeypatch):
    from dflash_convert.targets import sglang

    def build(job, tmp):
        raise RuntimeError("boom")

    monkeypatch.setattr(sglang, "build", build)
    with pytest.raises(RuntimeError, match="boom"):
        main([str(pair[1]), "--to", "sglang", "--out", str(tmp_path / "o"), "--debug"])
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_during_start_up_is_one_line(tmp_path):
    """The console script imports torch inside main: a Ctrl-C while it loads is reported like any other."""
    import subprocess
    import sys

    interrupt_torch_import = (
        "import sys\n"
        "class Interrupt:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch':\n"
        "            raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, Interrupt())\n"
        "from dflash_convert.cli import main\n"
        "raise SystemExit(main(sys.argv[1:]))\n")
    done = subprocess.run([sys.executable, "-c", interrupt_torch_import, str(tmp_path / "src"), "--to", "sglang",
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 130, done.stderr
    assert done.stderr == "dflash-convert: interrupted; no partial output was left behind.\n"
    assert list(tmp_path.iterdir()) == []
