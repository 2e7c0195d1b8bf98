"""The CUA episode loop under slime (THUDM/slime, the commit named in ``NOTICE``).

Two routes, both running the AReaL path's group runner and SGLang requests (docs/slime.md):

- in process: ``cua_native.slime.rollout.generate_rollout``, slime's ``--rollout-function-path``;
- the Rollout Buffer of slime's agent-rollout guide: ``python -m cua_native.slime buffer``
  (``buffer.py``), read by slime's own client, or by ``buffer_client.generate_rollout`` for the
  exact per-turn samples.

``python -m cua_native.slime tasks`` writes a config's tasks as slime prompt data. Nothing here
imports slime at module level: slime's classes are looked up when slime calls in.
"""
