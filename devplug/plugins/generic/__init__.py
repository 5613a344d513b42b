"""Built-in generic plugin: every device type torch knows and no dedicated plugin serves, through torch's own API.

Modules, one job each: `.catalog` (which device types, and what PyTorch documents about each),
`.probe` (is a type usable here, and why not), `.plugin` (the hook implementations). The
work itself — synchronize, memory, RNG, collective backend, precision, fused optimizers — is the core
fallback's device-generic path; this plugin declares the devices and adds per-type defaults.

The hooks live in `.plugin`, which devplug registers directly (nothing is re-exported here).
"""
