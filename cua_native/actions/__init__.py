"""Canonical actions, coordinate spaces, parse errors, and the model dialects."""
