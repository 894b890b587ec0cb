"""Exit statuses of dflash-convert and the errors that map to them."""

from dflash_core.errors import DFlashError

EXIT_BAD_INPUT = 2
EXIT_MISSING = 3
EXIT_VERIFY = 4


class MissingRequirement(DFlashError):
    """A tool or device the target needs is absent on this machine (exit 3)."""


class VerificationFailed(DFlashError):
    """The converted artefact does not reproduce the torch drafter (exit 4)."""


class OutputExists(DFlashError):
    """The output directory exists and --force was not given (exit 2)."""
