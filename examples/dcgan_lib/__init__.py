"""Reusable parts of ``examples/dcgan.py``: models, data sources, command line and run summary.

Nothing here is device-specific: the device, precision, optimizer implementation, data loader and
distributed setup all come from the devplug Trainer and its plugins.
"""
