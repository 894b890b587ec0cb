"""DFlash for SGLang (0.5.23): drafter directories its native DFLASH loads as is, and launch recipes.

Importing this package never imports sglang; the engine is imported lazily where it is needed.
"""

__version__ = "0.1.0"
