"""``geniex.cli.main`` called in-process, as an embedding program would."""
import json

import pytest

from geniex.cli import main


@pytest.mark.fast
def test_main_runs_the_list_verb_in_process(data_dir, monkeypatch, capsys):
    # The `list` verb module is bound as geniex.cli.list: main must not call it as the builtin.
    monkeypatch.setenv("GENIEX_DATADIR", str(data_dir))
    assert main(["list", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert isinstance(rows, list)
    assert main(("ls",)) == 0          # any sequence of arguments
