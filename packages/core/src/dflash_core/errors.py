"""Errors meant for people: one sentence saying what is wrong and what was expected."""

from __future__ import annotations


class DFlashError(Exception):
    """Base class: the message is a single line a user can act on (no stack trace needed)."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


class ConfigError(DFlashError, ValueError):
    """A configuration field is missing or outside its bounds."""


class CheckpointError(DFlashError, ValueError):
    """A checkpoint file is missing, corrupt, or holds tensors of the wrong name or shape."""


class CompatibilityError(DFlashError, ValueError):
    """A drafter and a target model do not fit together."""


class GenerationError(DFlashError, ValueError):
    """A generation request is invalid (empty prompt, bad sampling parameters, too long...)."""


class DataError(DFlashError, ValueError):
    """A training data set is missing, empty or corrupt."""


class OutputError(DFlashError, ValueError):
    """An output location would modify an input or clobber data that is not this command's own."""
