__version__ = "0.2.0"
"""The installed devplug release."""
