"""Stand-in for PyPI's unrelated ``apex`` (a Pyramid toolkit): a package named apex, no ``apex.optimizers``.

Tests only, never shipped.
"""

__version__ = "0.9.10dev"
