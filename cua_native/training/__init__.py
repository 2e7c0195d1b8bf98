"""Training: the warm start (``warmstart/``), the embedded trainer (``embedded/``) and the AReaL
cluster path (``cluster/``); ``local_engine`` is the one-process train engine the first two share."""
