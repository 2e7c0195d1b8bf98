"""The monitor dashboard: read-only pages over the store plus the ingest endpoint."""
