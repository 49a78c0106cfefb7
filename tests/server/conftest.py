"""Test order for the server tests' shared servers.

A module's tests share one in-process server (a module-scoped fixture), and that server
holds one model at a time: a request for another model or another load setting reloads
it (a model load, warm-up and timing decode in the worker). A test marked
``@pytest.mark.resident("name")`` says which model or setting it needs resident; tests
of one module run grouped by that value, groups in the order their first test appears
in the file, unmarked tests (those that load nothing, such as validation errors) first.
Each group then costs one load instead of one per test. The order changes no outcome:
every test sends what it needs, and a test that finds another model resident only
waits for a reload.
"""
import itertools

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "resident(name): the model or load setting a test needs resident in its "
                                       "module's shared server; tests/server/conftest.py groups tests by it")


def _resident(item):
    marker = item.get_closest_marker("resident")
    return None if marker is None else marker.args[0]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    ordered = []
    for _, run in itertools.groupby(items, key=lambda item: getattr(item, "module", None)):
        run = list(run)
        rank = {}                       # each resident value, in the order it first appears
        for name in filter(None, map(_resident, run)):
            rank.setdefault(name, len(rank))
        # A stable sort: unmarked tests first, then one group per value, file order inside.
        ordered += sorted(run, key=lambda item: rank.get(_resident(item), -1))
    items[:] = ordered
