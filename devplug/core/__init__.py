"""devplug's device-neutral core: hook contract, plugin manager, device resolution, Trainer."""
