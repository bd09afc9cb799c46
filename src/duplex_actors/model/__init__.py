"""The model engine: a synchronous, batched lockstep engine over the real ``moshi`` package.

Nothing in this package imports trio; the engine is driven from one worker thread.
"""
