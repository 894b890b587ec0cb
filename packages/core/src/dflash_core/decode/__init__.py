"""The reference decode loop: draft sources (the drafter, context lookup), the verifier, the step, the
target alone, streaming text, profiling.

The top of the runtime: may import every package but `training`.
"""
