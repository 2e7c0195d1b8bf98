"""The monitor service: ingest into the schema store, migrations, dashboard."""
