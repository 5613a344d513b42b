"""Several processes: the launcher's environment, the process group, DDP, flags combined across ranks."""
