"""Stand-in for NVIDIA apex (tests only, never shipped): just enough of ``apex.optimizers``."""
