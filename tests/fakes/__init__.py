"""The test fakes, in one place: stand-ins for the other side of a contract where the real one
is not what a test is about (a scripted engine, small real gyms, a gym that fails on demand).
Import them as ``fakes.<module>`` (``pythonpath`` in ``pyproject.toml``); the conftests hand
them to tests as fixtures."""
