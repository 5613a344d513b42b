"""devplug template plugin: the simulated device ``cpusim`` and the device-neutral step counter.

The plugins themselves are the modules `devplug_template_device.device` and
`devplug_template_device.stepcount`, each named by an entry point in the ``devplug`` group (see
``pyproject.toml``). This package module stays empty of hooks so that importing it registers nothing.
"""

__version__ = "0.1.0"
