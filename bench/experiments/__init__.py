"""Learning experiments: each writes its outputs, and keeps its note, under
``bench/experiments/results/<experiment>/``."""
