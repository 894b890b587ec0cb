"""Shared test settings.

Tests use tiny models, for which one intra-op thread is fastest, and a single thread keeps the
suite from fighting other work on a 2-core machine (OpenMP spin-waiting can make tiny matmuls
100x slower when cores are oversubscribed).
"""

import torch

torch.set_num_threads(1)
