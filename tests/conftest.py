"""The suite's shared fixtures live in tests/support/ (on pytest's pythonpath, see
setup.cfg): ``shared_fixtures`` (models, data dirs, the CLI runner), ``fakehub`` (a Hugging
Face Hub stand-in on a loopback port) and ``parallel`` (pytest-xdist workers, one CPU each)."""
pytest_plugins = ["shared_fixtures", "fakehub", "parallel"]
