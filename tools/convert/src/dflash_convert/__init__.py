"""dflash-convert: compile DFlash drafter checkpoints for each deployment target."""

__version__ = "0.1.0"
