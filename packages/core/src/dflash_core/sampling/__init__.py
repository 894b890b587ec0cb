"""Tokens from logits and the acceptance math: greedy, temperature / top-k / top-p, speculative sampling.

Pure functions of tensors and a generator; imports only the base modules.
"""
