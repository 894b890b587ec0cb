"""Everything that measures this machine: the dtype probe, the verify cost table, the draft-length
policy that decides by it, and `Tuning`, the object that holds these measurements and where they are cached.

May import everything below it (base, `files`, `kernels`, `sampling`, `model`, `target`); never `decode`.
"""
