"""Stand-in for ``habana_frameworks.torch.hpex`` (Habana extensions)."""
