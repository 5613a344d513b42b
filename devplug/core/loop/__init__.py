"""The Trainer and the pieces of the author's loop: configuration, the step, stop signals, checkpoint state."""
