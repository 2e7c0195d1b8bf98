"""The monitor's SQL store (SQLite/PostgreSQL): schema, migrations, the batch writer and its tallies.

Shared by the client (``SqlSink`` writes a run's ingest batches in process) and the service
(the dashboard reads it and ingests batches sent over HTTP); it imports only the ingest contract
(``monitor/ingest.py``, ``monitor/screenshots.py``)."""
