"""Benchmarks and experiments, run from the repository root (``uv run python bench/perf/loop.py``
or ``uv run python -m bench.perf.loop``): ``perf/`` times the parts, ``gpu/`` checks and times them on a
GPU, ``experiments/`` measures learning; each keeps its outputs under its ``results/``."""
