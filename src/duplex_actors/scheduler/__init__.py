"""The scheduler actor: one per process, owns the engine, steps every session in one batch."""
