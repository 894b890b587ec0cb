"""SGLang's own DFLASH worker on a CPU: a stand-in `sgl_kernel` package and a few named runtime patches.

- `stand_in/` holds a package named `sgl_kernel` (pure-torch versions of the ops SGLang calls on the
  CPU); `dflash serve --device cpu` puts that folder on the server's PYTHONPATH, nowhere else.
- `patches.py` holds the hooks the plugin registers in a process of SGLang's CPU engine only.
See docs/sglang-cpu.md for what each replaces and what stays GPU-only.
"""

from __future__ import annotations

from pathlib import Path

STAND_IN_DIR = Path(__file__).with_name("stand_in")  # the folder to put on PYTHONPATH (holds sgl_kernel/)
