"""Exit statuses of dflash-convert and the errors that map to them."""

from dflash_core.errors import DFlashError

EXIT_INTERNAL = 1
EXIT_BAD_INPUT = 2
EXIT_MISSING = 3
EXIT_VERIFY = 4
# 130 (interrupted) lives in cli.py: it must be known before the heavy imports this module brings.


class MissingRequirement(DFlashError):
    """A tool or device the target needs is absent on this machine (exit 3)."""


class VerificationFailed(DFlashError):
    """The converted artefact does not reproduce the torch drafter (exit 4)."""
