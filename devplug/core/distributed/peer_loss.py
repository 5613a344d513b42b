"""Telling a collective that failed because another process of the job is gone from any other error.

When one rank of a job ends (an error of its own, kill -9, an out-of-memory kill), every other rank's next
collective fails inside torch.distributed: gloo with "Connection reset by peer", NCCL with a backend error,
the rendezvous store with a timeout. That is not a fault of these ranks, and a traceback from each of them
only hides the one line that says what went wrong (the failed rank's own). `lost_peer` recognises such a
failure, so a script can say so in one line and exit with a non-zero status.
"""

from __future__ import annotations

import re
import sys
from types import TracebackType

#: What gloo, NCCL and the TCP store say when the other end of a collective went away or stopped answering.
_GONE = re.compile(r"connection (?:reset|closed|refused)|broken pipe|closed by peer|timed? ?out|"
                   r"remote process exited|peer|socket", re.IGNORECASE)


def _raised_in_torch(traceback: TracebackType | None) -> bool:
    """True when the innermost Python frame of ``traceback`` is torch.distributed's (a collective's ``wait``) or
    the autograd engine's (running DDP's gradient all-reduce); not, say, a data loader's timeout."""
    innermost = None
    while traceback is not None:
        innermost, traceback = traceback, traceback.tb_next
    if innermost is None:
        return False
    name = innermost.tb_frame.f_globals.get("__name__", "")
    return isinstance(name, str) and name.startswith(("torch.distributed", "torch.autograd"))


def _peer_gone(error: BaseException, dist_error: type[BaseException]) -> bool:
    """Whether ``error`` is a collective's failure for want of its peers (see `lost_peer`)."""
    return isinstance(error, dist_error) or (isinstance(error, RuntimeError) and _raised_in_torch(error.__traceback__)
                                             and _GONE.search(str(error)) is not None)


def lost_peer(error: BaseException) -> str | None:
    """One line for ``error`` when it is a collective that failed because another process of the job ended or
    stopped answering (its own output says why), ``None`` for anything else.

    Only under a joined process group of several ranks: a `torch.distributed.DistError` (backend, network,
    store), or a ``RuntimeError`` raised inside torch whose message says the connection went away (gloo raises
    those as plain ``RuntimeError``, from a collective or from DDP's all-reduce in ``backward``).
    """
    distributed = sys.modules.get("torch.distributed")  # never imported here: a run that joined one imported it
    if distributed is None or not distributed.is_available() or not distributed.is_initialized():
        return None
    try:
        rank, world = distributed.get_rank(), distributed.get_world_size()
    except RuntimeError:
        return None
    if world < 2 or not _peer_gone(error, distributed.DistError):
        return None
    reason = " ".join(str(error).split())
    reason = re.sub(r"^\[[^\]]*\.(?:cc|cpp):\d+\]\s*", "", reason)  # gloo's source file and line
    reason = reason.split(". ", 1)[0].rstrip(".")  # its first sentence: the rest is advice for torch's own bugs
    reason = reason if len(reason) <= 160 else reason[:157] + "..."
    return (f"rank {rank} of {world}: another process of this job ended or stopped answering during a collective "
            f"({reason or type(error).__name__}); its own output says why. The checkpoints already written are "
            "kept: fix that and resume from the newest")
