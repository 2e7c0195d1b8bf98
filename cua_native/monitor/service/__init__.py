"""The monitor service: the dashboard and its HTTP ingest API over the store (``monitor/db``)."""
