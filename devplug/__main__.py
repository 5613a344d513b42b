"""``python -m devplug``: the ``devplug`` command (devices, check, doctor, consolidate), for environments without
the script."""

import sys

from devplug._console import main

sys.exit(main())
