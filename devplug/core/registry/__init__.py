"""Plugins loaded, devices resolved to one plugin, hook answers checked and plugin failures named."""
