"""Core rollout and execution (genv, mini_agent_runner, rollout_logger)."""
