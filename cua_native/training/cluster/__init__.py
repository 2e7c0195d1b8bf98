"""The cluster path: AReaL's ``PPOTrainer`` with the CUA workflow, its load-time checks, the
patched schedulers (local, Ray, Slurm) and FSDP actor, attached engines, and the rehearsal."""
