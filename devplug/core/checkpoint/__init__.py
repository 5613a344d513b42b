"""Checkpoint files: atomic writes, validation before restore, digest, sniffing, temp files, RNG state."""
