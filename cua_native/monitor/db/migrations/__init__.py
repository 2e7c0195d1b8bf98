"""Alembic migrations of the monitor schema, run programmatically by ``MonitorStore.open``."""
