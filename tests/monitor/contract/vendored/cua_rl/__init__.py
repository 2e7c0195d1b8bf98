"""CUA RL utilities (genv, gbox-mini-agent, task loading, monitor). No tinker dependency."""
