"""Will the model fit? The network's size from the flags (built on the meta device: no memory used) against
the memory there is, checked before anything is allocated, so ``--width 1000000`` is one line, not an
allocator traceback."""

from __future__ import annotations

import torch

from devplug.toolkit import check_model_fits

from lm.models import LanguageModel, ModelSpec, count_parameters

#: fp32 weight, gradient and AdamW's two moments.
TRAINING_BYTES_PER_PARAMETER = 16
#: Activation values kept for backward per token and layer, in units of the width (attention and 4x MLP).
ACTIVATIONS_PER_TOKEN_AND_LAYER = 20


def parameter_count(spec: ModelSpec) -> int:
    """The network's trainable parameters, counted on the meta device (nothing is allocated)."""
    with torch.device("meta"):
        return count_parameters(LanguageModel(spec))


def check_memory(spec: ModelSpec, batch_size: int, *, shards: int, device_total: int | None,
                 host_available: int | None) -> None:
    """Raise `devplug.ConfigError` when the network cannot be built or trained in the memory there is.

    It is built in host memory (4 bytes per parameter), then trained where the device plugin puts it
    (``device_total`` bytes, or host memory when the device reports none), its training state split over
    ``shards`` ranks under FSDP.
    """
    params = parameter_count(spec)
    weights = 4 * params
    training = TRAINING_BYTES_PER_PARAMETER * params // shards + 4 * batch_size * spec.context * (
        ACTIVATIONS_PER_TOKEN_AND_LAYER * spec.width * spec.layers + 2 * 256)
    sizes = f"{params:,} parameters (--width {spec.width}, --layers {spec.layers})"
    check_model_fits(build_bytes=weights, train_bytes=training, model=sizes,
                     batch=f"a batch of {batch_size} x {spec.context}", flags="--width/--layers/--context/--batch-size",
                     device_total=device_total, host_available=host_available,
                     contents="weights, gradients, AdamW state, activations")
