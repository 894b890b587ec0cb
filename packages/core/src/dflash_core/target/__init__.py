"""The target: a Hugging Face causal LM seen through what DFlash needs (adapter), its KV cache during
speculative decoding, checks of a target directory, pairing with a drafter, and prompts as token ids.

May import the base modules, `files`, `kernels`, `sampling` and `model`.
"""
