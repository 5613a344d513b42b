"""Stand-in for ``habana_frameworks.medialoaders`` (Intel Gaudi media loaders)."""
