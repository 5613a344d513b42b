"""Data to the device: the loop's position, loaders that advance it, the torch loader, images, loader tuning."""
