"""Environments behind one async protocol."""
