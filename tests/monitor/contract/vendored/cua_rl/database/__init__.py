"""Training Monitor ingest client, context, rollout recorder."""
