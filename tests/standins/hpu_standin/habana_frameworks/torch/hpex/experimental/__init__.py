"""Stand-in for ``habana_frameworks.torch.hpex.experimental`` (Intel's experimental Gaudi extensions)."""
