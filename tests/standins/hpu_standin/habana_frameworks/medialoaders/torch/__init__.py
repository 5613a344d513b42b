"""Stand-in for ``habana_frameworks.medialoaders.torch``."""
