"""`dflash-convert SRC --to {sglang,vllm,trtllm,onnx,tensorrt} --out DIR`: compile a drafter for a deployment target.

Exit status: 0 done, 2 bad input (named in one line), 3 a required tool or GPU is missing,
4 the converted artefact failed its check against the torch drafter, 1 an internal error (a bug),
130 interrupted. Inputs are never modified: an --out that is, contains or lies inside SRC or
--target-model is refused, --force included. Nothing is left half-written: the output is staged in
a temporary directory and renamed into place only when complete.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dflash_core.dtypes import SHORT_NAMES
from dflash_core.errors import DFlashError
from dflash_core.files.atomic import atomic_directory, guard_output

from . import __version__
from .errors import EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_MISSING, EXIT_VERIFY, MissingRequirement, VerificationFailed
from .output import shell_line, write_manifest
from .source import read_source, source_location
from .target_facts import check_target, read_target
from .targets import Job
from .targets import onnx as onnx_target
from .targets import sglang, tensorrt, trtllm, vllm

TARGETS = {"sglang": sglang, "vllm": vllm, "trtllm": trtllm, "onnx": onnx_target, "tensorrt": tensorrt}


class OneLineParser(argparse.ArgumentParser):
    """A usage error is one line on stderr and exit status 2, like every other bad input."""

    def error(self, message: str):
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {' '.join(message.split())} (see --help)\n")


def path_arg(text: str) -> Path:
    if not text.strip():  # Path("") is the current directory: never what an empty value meant
        raise argparse.ArgumentTypeError("expected a path, got an empty string")
    return Path(text)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="dflash-convert", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", metavar="SRC", type=path_arg,
                   help="drafter: published-format directory, weights file, index, or a `dflash train` output / "
                        "train_state")
    p.add_argument("--to", required=True, choices=sorted(TARGETS), help="deployment target")
    p.add_argument("--out", required=True, type=path_arg, help="output directory (created atomically)")
    p.add_argument("--target-model", type=path_arg, default=None,
                   help="target model directory: enables compatibility checks and tokenizer updates")
    p.add_argument("--dtype", choices=SHORT_NAMES, default=None,
                   help="precision of the output (default: bf16 for engines, fp32 for onnx, fp16 for tensorrt)")
    p.add_argument("--with-lm-head", action="store_true", help="onnx/tensorrt: output draft logits (needs --target-model)")
    p.add_argument("--force", action="store_true", help="replace an existing output directory")
    p.add_argument("--dry-run", action="store_true", help="print the plan and write nothing")
    p.add_argument("--debug", action="store_true", help="show the traceback of an internal error")
    p.add_argument("--version", action="version", version=f"dflash-convert {__version__}")
    return p


def make_job(args) -> Job:
    source = read_source(args.src)
    module = TARGETS[args.to]
    job = Job(source=source, out=args.out.resolve(), dtype=args.dtype or module.DEFAULT_DTYPE,
              with_lm_head=args.with_lm_head)
    if args.target_model is not None:
        job.target = read_target(args.target_model)
        job.mask_note = check_target(source.config, job.target)
    module.check(job)
    return job


def check_output(args) -> None:
    """Refuse an --out that would touch an input (SRC, the directory it is read from, --target-model)."""
    src = args.src
    inputs = [src, source_location(src)[0]]
    if args.target_model is not None:
        inputs.append(args.target_model)
    guard_output(args.out, inputs, force=args.force)


def convert(args) -> int:
    check_output(args)
    job = make_job(args)
    module = TARGETS[args.to]
    if job.mask_note:
        print(f"note: {job.mask_note}", file=sys.stderr)
    if args.dry_run:
        print(f"plan: {job.source.kind} {job.source.path} -> {args.to} at {job.out} (nothing is written)")
        for line in module.plan(job):
            print(f"  - {line}")
        if hasattr(module, "command"):
            print(f"  command: {shell_line(module.command(job))}")
        return 0
    # check_output allowed an existing directory only when empty or with --force
    with atomic_directory(job.out, overwrite=args.force or job.out.is_dir()) as tmp:
        result = module.build(job, tmp)
        options = {"to": args.to, "dtype": job.dtype, "target_model": str(args.target_model or ""),
                   "with_lm_head": job.with_lm_head, **result.manifest_options}
        write_manifest(tmp, target=args.to, source=job.source, options=options)
    for line in result.lines:
        print(f"{job.out}: {line}")
    if result.command:
        print(shell_line(result.command))
    return 0


def one_line(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    return " ".join(str(exc).split()) or type(exc).__name__


def run(argv: list[str] | None = None) -> int:
    """The whole command; a Ctrl-C propagates to `cli.main`, which reports it."""
    args = build_parser().parse_args(argv)
    try:
        return convert(args)
    except MissingRequirement as exc:
        print(f"dflash-convert: {exc}", file=sys.stderr)
        return EXIT_MISSING
    except VerificationFailed as exc:
        print(f"dflash-convert: verification failed: {exc}", file=sys.stderr)
        return EXIT_VERIFY
    except (DFlashError, OSError) as exc:
        print(f"dflash-convert: error: {one_line(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as exc:  # a bug: one line, and the traceback on request
        if args.debug:
            raise
        print(f"dflash-convert: internal error: {type(exc).__name__}: {one_line(exc)} "
              "(re-run with --debug for the traceback)", file=sys.stderr)
        return EXIT_INTERNAL
