"""Every file or folder of this repository that a user page names exists."""

from __future__ import annotations

import re

from paths import REPO

PAGES = [*sorted((REPO / "docs").rglob("*.md")), REPO / "README.md", REPO / "examples" / "dcgan" / "README.md"]
# a repository path in backticks: `devplug/plugins/cuda/optimizer_state.py`, `examples/dcgan/`
NAMED = re.compile(r"`((?:devplug|examples|tests|benchmarks|docs)/[A-Za-z0-9_./\-]*)`")
VENDOR_PATHS = {"tests/pytest_working/any_mode/test_hpu_fp8_te.py"}  # a path in Intel's bridge, cited as such


def test_every_repository_path_a_page_names_exists():
    missing = []
    for page in PAGES:
        text = page.read_text()
        for match in NAMED.finditer(text):
            path = match.group(1).rstrip(".")
            if "..." in path or path in VENDOR_PATHS:
                continue
            if not (REPO / path).exists():
                missing.append(f"{page.relative_to(REPO)}:{text.count(chr(10), 0, match.start()) + 1} {path}")
    assert not missing, "pages name files that do not exist: " + ", ".join(missing)
