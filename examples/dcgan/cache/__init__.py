"""An image folder decoded once into a uint8 memory-mapped cache, so training opens no image file.

Read straight from the folder, the data loader is the bottleneck: every batch opens and decodes many
image files (photos of 360×480 pixels, say) only to shrink them to 64×64 for the device. Here the folder
is decoded, resized (short side) and center-cropped once, out of band, into ``<cache-dir>/<name>.npy``
(N×3×S×S uint8, memory-mapped); training then reads slices of that file. A JSON file beside it records
what it was built from.

- `.prepare`: `prepare_cache`, which reuses the cache or builds it, and its `CacheReport`;
- `.dataset`: `CachedImages`, the data set the loader reads;
- `.decode_pool`: decoding on every core, in workers that die with their parent;
- `.writer`: the free-space check and a fully allocated file, so a full disk is one clear error;
- `.locks`: cache versions shared safely between jobs (none deleted while in use, one build at a time).
"""

from .dataset import CachedImages
from .decode_pool import decode_image
from .prepare import CacheReport, default_cache_dir, prepare_cache

__all__ = ["CacheReport", "CachedImages", "decode_image", "default_cache_dir", "prepare_cache"]
