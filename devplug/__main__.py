"""``python -m devplug``: the ``devplug`` command (devices, check, doctor), for environments without the script."""

import sys

from devplug.cli import main

sys.exit(main())
