"""Model factories and chat templates."""
