"""`dflash-convert SRC --to {sglang,trtllm,onnx,tensorrt} --out DIR`: compile a drafter for a deployment target.

Exit status: 0 done, 2 bad input (named in one line), 3 a required tool or GPU is missing,
4 the converted artefact failed its check against the torch drafter. Nothing is left half-written:
the output is staged in a temporary directory and renamed into place only when complete.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dflash_core.dtypes import SHORT_NAMES
from dflash_core.errors import DFlashError
from dflash_core.fileio import atomic_directory

from . import __version__
from .errors import EXIT_BAD_INPUT, EXIT_MISSING, EXIT_VERIFY, MissingRequirement, OutputExists, VerificationFailed
from .output import shell_line, write_manifest
from .source import read_source
from .target_facts import check_target, read_target
from .targets import Job
from .targets import onnx as onnx_target
from .targets import sglang, tensorrt, trtllm

TARGETS = {"sglang": sglang, "trtllm": trtllm, "onnx": onnx_target, "tensorrt": tensorrt}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dflash-convert", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", metavar="SRC", help="drafter: published-format directory, weights file, index, "
                                              "or a `dflash train` output / train_state")
    p.add_argument("--to", required=True, choices=sorted(TARGETS), help="deployment target")
    p.add_argument("--out", required=True, type=Path, help="output directory (created atomically)")
    p.add_argument("--target-model", type=Path, default=None,
                   help="target model directory: enables compatibility checks and tokenizer updates")
    p.add_argument("--dtype", choices=SHORT_NAMES, default=None,
                   help="precision of the output (default: bf16 for engines, fp32 for onnx, fp16 for tensorrt)")
    p.add_argument("--with-lm-head", action="store_true", help="onnx/tensorrt: output draft logits (needs --target-model)")
    p.add_argument("--force", action="store_true", help="replace an existing output directory")
    p.add_argument("--dry-run", action="store_true", help="print the plan and write nothing")
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


def convert(args) -> int:
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
    if job.out.exists() and not args.force:
        raise OutputExists(f"{job.out} already exists; pass --force to replace it.")
    with atomic_directory(job.out, overwrite=args.force) as tmp:
        result = module.build(job, tmp)
        options = {"to": args.to, "dtype": job.dtype, "target_model": str(args.target_model or ""),
                   "with_lm_head": job.with_lm_head, **result.manifest_options}
        write_manifest(tmp, target=args.to, source=job.source, options=options)
    for line in result.lines:
        print(f"{job.out}: {line}")
    if result.command:
        print(shell_line(result.command))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return convert(args)
    except MissingRequirement as exc:
        print(f"dflash-convert: {exc}", file=sys.stderr)
        return EXIT_MISSING
    except VerificationFailed as exc:
        print(f"dflash-convert: verification failed: {exc}", file=sys.stderr)
        return EXIT_VERIFY
    except (DFlashError, ValueError, OSError) as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(f"dflash-convert: error: {message}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    raise SystemExit(main())
