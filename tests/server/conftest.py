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
import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "resident(name): the model or load setting a test needs resident in its "
                                       "module's shared server; tests/server/conftest.py groups tests by it")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    start = 0
    while start < len(items):
        module = items[start].module if hasattr(items[start], "module") else None
        end = start
        while end < len(items) and getattr(items[end], "module", None) is module:
            end += 1
        run = items[start:end]
        if module is not None and any(item.get_closest_marker("resident") for item in run):
            rank = {}
            for item in run:
                marker = item.get_closest_marker("resident")
                if marker is not None:
                    rank.setdefault(marker.args[0], len(rank))
            items[start:end] = sorted(run, key=lambda item: -1 if item.get_closest_marker("resident") is None
                                      else rank[item.get_closest_marker("resident").args[0]])
        start = end
