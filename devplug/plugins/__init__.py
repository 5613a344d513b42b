"""Built-in device plugins. Each is loaded through the same path as a third-party entry point."""
