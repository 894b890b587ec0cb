"""The drafter: config, block mask, rotary positions, the KV-injection graph, the nn.Module, checkpoints,
its K/V cache, read-out vocabulary, and the runtimes that run it (torch eager, ONNX Runtime).

May import the base modules, `files`, `kernels` and `sampling`; never the target adapter, tuning or decoding.
"""
