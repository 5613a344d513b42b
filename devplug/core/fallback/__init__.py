"""Device-generic PyTorch: the trylast plugin that answers every hook, and what torch's own API can tell."""
