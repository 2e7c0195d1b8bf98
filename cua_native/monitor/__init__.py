"""Training Monitor: the ingest contract, the SQL store (SQLite/PostgreSQL), the dashboard."""
