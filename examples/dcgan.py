#!/usr/bin/env python
"""Starts the DCGAN example, ``examples/dcgan/train.py``: ``python examples/dcgan.py --help`` lists every flag.

The example is the folder ``examples/dcgan/`` (see its README.md); this launcher keeps the command
``python examples/dcgan.py`` (and ``torchrun ... examples/dcgan.py``) that the docs and the Makefile use.
"""

import gc

gc.disable()  # no collections while torch is imported: its ~180,000 objects live as long as the process (below)

import sys  # noqa: E402

import devplug  # noqa: E402

try:
    from dcgan.train import main  # examples/ is on sys.path when this file runs: dcgan is the folder
except KeyboardInterrupt:  # Ctrl-C while torch loads: nothing has started, so one line and the usual status
    print("dcgan: interrupted", file=sys.stderr)
    sys.exit(130)

gc.enable()  # run_as_script has the collector leave what the imports made alone (gc.freeze)

if __name__ == "__main__":
    devplug.ConfigParser.run_as_script(main)
