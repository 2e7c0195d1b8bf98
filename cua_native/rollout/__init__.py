"""The rollout: tasks to training rows (episode, agent, records, trajectory, workflow)."""
