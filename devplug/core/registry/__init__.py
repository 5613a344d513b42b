"""Plugins loaded, devices resolved to one plugin, hook answers checked, plugin failures named, and the calls
into plugins that may hang (probes, doctor, the precision plan) bounded in time."""
