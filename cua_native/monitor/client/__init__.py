"""The monitor client that runs inside training: events, recorder, spill, sinks, worker."""
