"""The warm start: the simulator's solution paths as SFT rows (``demos``) and the supervised
warm start of the embedded model on them (``sft``)."""
