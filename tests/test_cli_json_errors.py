"""`devplug ... --json` prints its error as JSON on stdout for bad arguments too, as the docs promise."""

from __future__ import annotations

import json

import pytest

from devplug import cli


@pytest.mark.parametrize("argv", [["devices", "--json", "--bogus"], ["check", "--json"],
                                  ["check", "cpu", "--json", "--allow-unavailible"]])
def test_bad_arguments_with_json_print_the_error_as_json(capsys, argv):
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == cli.EXIT_ERROR == 2
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert data["exit_code"] == 2
    assert data["error"].startswith("devplug") and data["error"].split(": ", 1)[1] in err


def test_bad_arguments_without_json_print_no_json(capsys):
    with pytest.raises(SystemExit):
        cli.main(["devices", "--bogus"])
    out, err = capsys.readouterr()
    assert out == "" and "unrecognized arguments: --bogus" in err
