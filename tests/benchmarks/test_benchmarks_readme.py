"""benchmarks/README.md is a results table plus the method; the runs and their discussion live in HISTORY.md."""

from __future__ import annotations

import re

from paths import REPO

BENCHMARKS = REPO / "benchmarks"


def _scripts() -> list[str]:
    return sorted(p.name for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_") and p.name != "run_all.py")


def test_the_readme_is_a_results_table_and_the_method():
    text = (BENCHMARKS / "README.md").read_text()
    assert len(text.splitlines()) <= 200, "results and method only; runs and discussion go to HISTORY.md"
    results = text.split("## Results", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in results.splitlines() if line.startswith("| ") and not line.startswith("| question")]
    for script in _scripts():
        assert any(f"`{script}`" in row for row in rows), f"no result row for {script}"
    assert "## Method" in text and "## Files" in text


def test_every_script_has_its_history_and_every_link_lands():
    readme, history = (BENCHMARKS / "README.md").read_text(), (BENCHMARKS / "HISTORY.md").read_text()
    headings = {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in re.findall(r"^#+ (.+)$", history, re.M)}
    for script in _scripts():
        assert f"## `{script}`" in history, f"HISTORY.md has no section for {script}"
    for anchor in re.findall(r"\(HISTORY\.md#([\w-]+)\)", readme):
        assert anchor in headings, anchor
