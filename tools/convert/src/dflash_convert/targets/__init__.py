"""One module per deployment target; each declares its tensor table, checks, plan and build."""

from dataclasses import dataclass, field
from pathlib import Path

from ..source import Source
from ..target_facts import TargetFacts


@dataclass
class Job:
    source: Source
    out: Path  # final location (absolute); files are staged elsewhere and renamed here
    dtype: str  # fp32 | bf16 | fp16
    target: TargetFacts | None = None
    mask_note: str | None = None
    with_lm_head: bool = False
    options: dict = field(default_factory=dict)


@dataclass
class Result:
    lines: list[str]  # what was written / measured, for the user
    command: list[str] | None = None  # how to serve it
    manifest_options: dict = field(default_factory=dict)


def target_path_or_placeholder(job: Job) -> str:
    return str(job.target.path.resolve()) if job.target else '"${TARGET_MODEL:?set TARGET_MODEL to the target model directory}"'


def mask_token_added(job: Job) -> bool:
    return bool(job.mask_note and job.mask_note.startswith("the tokenizer had no mask token"))
