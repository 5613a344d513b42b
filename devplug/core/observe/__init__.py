"""Observing a run: the reporter, metrics, loggers, FLOPs and MFU, the profiler window, doctor's findings."""
