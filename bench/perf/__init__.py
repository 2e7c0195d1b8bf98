"""Throughput and latency benchmarks of the parts (parser, prompt, simulator, engine, loop, monitor,
recorder, desktops); figures in ``docs/results.md#benchmarks``."""
