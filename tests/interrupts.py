"""Program text for a child Python that sees Ctrl-C while torch is being imported (the slow part of start-up).

`CTRL_C_AT_TORCH_IMPORT` makes the child's first ``import torch`` raise `KeyboardInterrupt`, as a Ctrl-C typed
then does; a test appends what the child runs next (a launcher, the ``devplug`` command).
"""

CTRL_C_AT_TORCH_IMPORT = """
import sys

class CtrlC:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            raise KeyboardInterrupt
        return None

sys.meta_path.insert(0, CtrlC())
"""
