#!/usr/bin/env python
"""Starts the language-model example, ``examples/lm/train.py``: ``python examples/lm.py --help`` lists every flag.

The example is the folder ``examples/lm/``; this launcher keeps the command ``python examples/lm.py``
(and ``torchrun ... examples/lm.py``) that the docs use.
"""

import sys

import devplug

try:
    from lm.train import main  # examples/ is on sys.path when this file runs: lm is the folder
except KeyboardInterrupt:  # Ctrl-C while torch loads: nothing has started, so one line and the usual status
    print("lm: interrupted", file=sys.stderr)
    sys.exit(130)

if __name__ == "__main__":
    devplug.ConfigParser.run_as_script(main)
