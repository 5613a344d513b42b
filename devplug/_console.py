"""The ``devplug`` console script's entry point: ``--version`` without importing torch, output into a pipe
that closes early (``devplug doctor | head``) ending quietly, as ``cat`` and ``grep`` do, and Ctrl-C at any
moment ending with one line and status 130.

Every command is `devplug.cli.main`; this module only stands in front of it, importing it when needed.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Sequence

from devplug._version import __version__

#: The status after Ctrl-C, as a shell reports a process that SIGINT ended (``devplug.cli.EXIT_INTERRUPTED``).
EXIT_INTERRUPTED = 128 + signal.SIGINT


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``devplug`` command with ``argv`` (default ``sys.argv[1:]``); the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--version"]:  # what argparse's version action prints, before torch is imported
        print(f"devplug {__version__}")
        return 0
    try:
        from devplug.cli import main as run

        status = run(args)
        if sys.stdout is not None:  # None: started with stdout closed (`devplug devices >&-`), print wrote nothing
            sys.stdout.flush()  # a reader that has gone shows here, inside the try, not at interpreter exit
    except BrokenPipeError:
        # The reader stopped reading (head, less quit): point stdout at /dev/null so the interpreter's own
        # flush at exit does not fail again, and exit as a process killed by SIGPIPE reports to the shell.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + 13
    except KeyboardInterrupt:  # Ctrl-C at any moment (torch loading, probes running): one line, as after a signal
        if "--json" in args:
            print(json.dumps({"error": "interrupted", "exit_code": EXIT_INTERRUPTED}))
        print("devplug: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return status
