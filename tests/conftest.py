"""Shared test settings.

Tests use tiny models, for which one intra-op thread is fastest, and a single thread keeps the
suite from fighting other work on a 2-core machine (OpenMP spin-waiting can make tiny matmuls
100x slower when cores are oversubscribed). Measured caches (dtype probe, verify cost tables) go
to a per-session folder, never to the user's cache directory.
"""

import os
import tempfile

import torch

torch.set_num_threads(1)
os.environ["DFLASH_CACHE_DIR"] = tempfile.mkdtemp(prefix="dflash-test-cache-")
