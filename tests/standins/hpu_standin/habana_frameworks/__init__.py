"""Stand-in for Intel's ``habana_frameworks`` namespace (tests only; see the README next to it)."""
