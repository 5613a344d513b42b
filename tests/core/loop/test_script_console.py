"""A script run by `devplug.ConfigParser.run_as_script` whose console reader goes away (``script.py | head``) keeps
running to its end: the lines nobody reads are dropped, the work (checkpoints, files) is not; a config file
that is not UTF-8 text is one line."""

from __future__ import annotations

import subprocess
import sys

import pytest
from paths import REPO

from devplug import ConfigParser

SCRIPT = """
import sys, devplug
def main():
    stream = getattr(sys, sys.argv[2])
    for step in range(200):
        print(f"step {step}", file=stream, flush=True)  # the reader has gone: the first flush meets a broken pipe
    open(sys.argv[1], "w").write("saved")
    print("summary", file=stream)
    return 5
devplug.ConfigParser.run_as_script(main)
"""


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_a_reader_that_stops_reading_does_not_stop_the_script(tmp_path, stream):
    marker = tmp_path / "saved.txt"
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    process = subprocess.Popen([sys.executable, "-c", SCRIPT, str(marker), stream], **pipes, cwd=REPO)
    gone, kept = (process.stdout, process.stderr) if stream == "stdout" else (process.stderr, process.stdout)
    assert gone is not None and kept is not None
    gone.close()  # no reader: every write to it fails with EPIPE
    other = kept.read().decode()
    assert process.wait(timeout=120) == 5, other
    assert "Traceback" not in other and "BrokenPipeError" not in other, other
    assert marker.read_text() == "saved"


def test_a_config_file_that_is_not_utf8_text_is_one_line(tmp_path, capsys):
    path = tmp_path / "run.toml"
    path.write_bytes(b"\xff\xfesteps = 3\n")
    parser = ConfigParser("demo.py")
    parser.add_argument("--steps", type=int)
    with pytest.raises(SystemExit) as stopped:
        parser.parse(["--config", str(path)])
    assert stopped.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("demo: error: --config "), lines
    assert str(path) in lines[0] and "not UTF-8 text" in lines[0], lines


def test_ctrl_c_before_the_script_parses_its_flags_is_one_line_and_130(tmp_path):
    script = tmp_path / "demo_train.py"
    script.write_text("import devplug\n"
                      "def main():\n"
                      "    raise KeyboardInterrupt  # before ConfigParser.run: building the parser, say\n"
                      "devplug.ConfigParser.run_as_script(main)\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert (done.returncode, done.stderr, done.stdout) == (130, "demo_train: interrupted\n", "")
