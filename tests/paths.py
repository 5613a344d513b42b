"""Where things are, for tests in any folder under tests/: the repository, the stand-ins, the example."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
STANDINS = TESTS / "standins"
