"""mypy over devplug/: no error beyond those recorded in mypy-baseline.txt, which may only shrink.

The settings are pyproject.toml's ``[tool.mypy]``: the public modules are checked strictly, the rest with
mypy's defaults plus a few checks. The baseline counts the errors left per file and error code. A new error
fails; so does a fixed one, until the baseline records the fix (the message says how). ``make lint`` runs
this file as a script, the test suite as a test:

    python tests/test_typecheck.py            # check
    python tests/test_typecheck.py --update   # record the current errors as the baseline
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path

import pytest
from paths import REPO

BASELINE = REPO / "mypy-baseline.txt"
UPDATE = "python tests/test_typecheck.py --update"

HEADER = f"""\
# The mypy errors left in devplug/ (pyproject.toml's [tool.mypy]), as `path: error-code count`.
# The counts may only shrink: an error beyond them fails `make lint` and tests/test_typecheck.py, and so
# does a count mypy no longer reaches, until the fix is recorded with `{UPDATE}`.
"""

Key = tuple[str, str]


def run_mypy() -> tuple[list[dict[str, object]], str]:
    """mypy's errors over devplug/ (pyproject.toml's settings, the cache in .mypy_cache), and what else it printed.

    Raises RuntimeError when mypy did not get to check the code (a crash, a configuration error).
    """
    result = subprocess.run([sys.executable, "-m", "mypy", "--output", "json"], cwd=REPO, capture_output=True,
                            text=True, check=False)
    errors, other = [], []
    for line in result.stdout.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            other.append(line)
            continue
        if record.get("severity") == "error":
            errors.append(record)
    if result.returncode not in (0, 1) or (result.returncode == 1 and not errors):
        raise RuntimeError(f"mypy exited with status {result.returncode}:\n{result.stdout}{result.stderr}")
    return errors, "\n".join(other + result.stderr.splitlines())


def _key(error: dict[str, object]) -> Key:
    return str(error["file"]).replace("\\", "/"), str(error.get("code") or "misc")


def count(errors: list[dict[str, object]]) -> collections.Counter[Key]:
    return collections.Counter(_key(error) for error in errors)


def read_baseline(path: Path = BASELINE) -> collections.Counter[Key]:
    counts: collections.Counter[Key] = collections.Counter()
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        file, _, rest = line.rpartition(": ")
        code, _, n = rest.partition(" ")
        if not file or not code or not n.isdigit():
            raise ValueError(f"{path.name}:{number}: expected `path: error-code count`, got {line!r}")
        counts[file, code] = int(n)
    return counts


def render_baseline(counts: collections.Counter[Key]) -> str:
    return HEADER + "".join(f"{file}: {code} {n}\n" for (file, code), n in sorted(counts.items()) if n)


def _format(error: dict[str, object]) -> str:
    return f"{error['file']}:{error['line']}: error: {error['message']}  [{error.get('code')}]"


def compare(errors: list[dict[str, object]], baseline: collections.Counter[Key]) -> list[str]:
    """What is wrong, one paragraph each: errors beyond the baseline, and counts the code no longer reaches."""
    current = count(errors)
    problems = []
    grown = sorted(key for key in current if current[key] > baseline[key])
    if grown:
        lines = [f"mypy found errors the baseline ({BASELINE.name}) does not allow; fix them "
                 "(or, for a false positive, add `# type: ignore[code]  # why`):"]
        for file, code in grown:
            lines.append(f"  {file}: {code}: {current[file, code]} now, {baseline[file, code]} allowed")
            lines += [f"    {_format(e)}" for e in errors if _key(e) == (file, code)]
        problems.append("\n".join(lines))
    shrunk = sorted(key for key in baseline if baseline[key] > current[key])
    if shrunk:
        lines = [f"fewer mypy errors than {BASELINE.name} records; record the progress with `{UPDATE}`:"]
        lines += [f"  {file}: {code}: {current[file, code]} now, {baseline[file, code]} recorded"
                  for file, code in shrunk]
        problems.append("\n".join(lines))
    return problems


def main(argv: list[str]) -> int:
    errors, other = run_mypy()
    if other:
        print(other)
    if "--update" in argv:
        BASELINE.write_text(render_baseline(count(errors)))
        print(f"{BASELINE.name}: {len(errors)} errors recorded")
        return 0
    problems = compare(errors, read_baseline())
    for problem in problems:
        print(problem, end="\n\n")
    if problems:
        return 1
    print(f"mypy: {len(errors)} errors, all in {BASELINE.name}")
    return 0


def test_mypy_finds_no_error_beyond_the_baseline():
    pytest.importorskip("mypy")
    errors, _ = run_mypy()
    problems = compare(errors, read_baseline())
    assert not problems, "\n\n".join(problems)


def test_the_baseline_reads_what_it_writes(tmp_path):
    counts = collections.Counter({("devplug/a.py", "arg-type"): 2, ("devplug/b/c.py", "misc"): 1})
    path = tmp_path / "baseline.txt"
    path.write_text(render_baseline(counts))
    assert read_baseline(path) == counts


def test_new_errors_and_fixed_errors_are_both_reported():
    def error(file: str, code: str) -> dict[str, object]:
        return {"file": file, "line": 1, "message": "m", "code": code, "severity": "error"}

    baseline = collections.Counter({("devplug/a.py", "arg-type"): 1, ("devplug/b.py", "misc"): 2})
    assert compare([error("devplug/a.py", "arg-type"), error("devplug/b.py", "misc"),
                    error("devplug/b.py", "misc")], baseline) == []
    grown, = compare([error("devplug/a.py", "arg-type"), error("devplug/a.py", "arg-type"),
                      error("devplug/b.py", "misc"), error("devplug/b.py", "misc")], baseline)
    assert "devplug/a.py: arg-type: 2 now, 1 allowed" in grown and "devplug/a.py:1: error: m" in grown
    new_code, shrunk = compare([error("devplug/a.py", "arg-type"), error("devplug/a.py", "call-arg")], baseline)
    assert "devplug/a.py: call-arg: 1 now, 0 allowed" in new_code
    assert "devplug/b.py: misc: 0 now, 2 recorded" in shrunk and UPDATE in shrunk


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
