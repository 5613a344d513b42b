"""The docs toolchain's end of life is decided and written down, and the pin says the same."""

from __future__ import annotations

import re

from paths import REPO


def test_the_end_of_life_decision_is_written_with_its_date_and_the_pin_holds_to_it():
    readme = " ".join((REPO / "README.md").read_text().split())
    decision = readme.split("**Documentation toolchain**", 1)[1].split("\n- **", 1)[0]
    assert "May 5, 2027" in decision and "The decision:" in decision and "by March 1, 2027" in decision
    pins = re.findall(r'"mkdocs-material([^"]*)"', (REPO / "pyproject.toml").read_text())
    assert pins and set(pins) == {">=9.5,<10"}, pins
    makefile = (REPO / "Makefile").read_text()
    assert "NO_MKDOCS_2_WARNING=1" in makefile and 'README.md, "Supported versions"' in makefile
