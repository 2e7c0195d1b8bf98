"""Training: the embedded single-process trainer and the AReaL cluster path."""
