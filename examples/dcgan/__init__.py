"""The DCGAN example: ``train.py`` (every option), ``minimal.py`` (the loop alone) and their helpers.

Nothing here is device-specific: the device, precision, optimizer implementation, data loader and
distributed setup all come from the devplug Trainer and its plugins. ``README.md`` says what each file is.
"""
