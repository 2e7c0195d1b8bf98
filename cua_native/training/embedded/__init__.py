"""The embedded trainer: GRPO on one machine with AReaL's ``PPOActor`` on the local engine, its
one evaluation (shared with ``python -m cua_native.evaluate``), its task order and its report."""
