"""Optimizers: torch's table and fastest kernels, building, the canonical state and its conversions, schedules."""
