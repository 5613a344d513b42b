#!/usr/bin/env python
"""Starts the DCGAN example, ``examples/dcgan/train.py``: ``python examples/dcgan.py --help`` lists every flag.

The example is the folder ``examples/dcgan/`` (see its README.md); this launcher keeps the command
``python examples/dcgan.py`` (and ``torchrun ... examples/dcgan.py``) that the docs and the Makefile use.
"""

import devplug

from dcgan.train import main  # examples/ is on sys.path when this file runs: dcgan is the folder

if __name__ == "__main__":
    devplug.ConfigParser.run_as_script(main)
