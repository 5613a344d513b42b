"""Stand-in for ``transformer_engine.Linear``: a drop-in for ``torch.nn.Linear`` that multiplies in fp8 inside
``fp8_autocast``, with delayed scaling from an amax history kept per module.

What it mirrors (HabanaAI/gaudi-pytorch-bridge 1.19, ``tests/pytest_working/any_mode/test_hpu_fp8_te.py``, and the
pre-1.19 source at commits ac47fb7c and f90046f4, ``module/base.py`` and ``module/linear.py``):

- the constructor's arguments (``in_features``, ``out_features``, ``bias``, ``params_dtype``,
  ``skip_weight_param_allocation`` with the weight then passed to ``forward`` or assigned afterwards, as
  optimum-habana 1.21.2 swaps ``nn.Linear`` layers: ``accelerate/utils/transformer_engine.py`` lines 83-99);
  its parameters are named ``weight`` and ``bias`` like ``nn.Linear``'s; it is not an ``nn.Linear`` subclass;
- outside ``fp8_autocast`` it is a plain linear layer; inside ``torch.autocast`` its output has the autocast
  dtype (test lines 651-688);
- ``fp8_meta``: the recipe and, per direction, ``scale``, ``scale_inv``, ``amax_history``
  (``amax_history_len`` rows; two columns forward, input and weight, one backward) and ``amax_history_index``
  (test lines 586-596 and 1941-1948: scales are 1 until amaxes have been measured); under HYBRID also
  ``scaling_hybrid``, the E5M2 scales of input and weight for the backward (test lines 1618-1631, 382-394);
- ``get_extra_state``: the fp8 meta pickled into a uint8 tensor, so ``state_dict()`` carries an ``_extra_state``
  entry next to ``weight`` and ``bias`` (test lines 1981-1993 and 2008-2011); ``set_extra_state`` restores it
  and returns at once for ``None`` (test lines 1163-1219 round-trip it).

The fp8 casts are emulated on the CPU: scaled, clamped to the format's largest value, rounded through torch's
float8 dtypes and scaled back. Every fp8 forward is recorded in ``hpu_standin_calls``.
"""

from __future__ import annotations

import pickle
from typing import Any

import hpu_standin_calls
import numpy as np
import torch

from habana_frameworks.torch.hpex.experimental.transformer_engine.fp8 import FP8GlobalStateManager, get_fp8_te_dtype
from habana_frameworks.torch.hpex.experimental.transformer_engine.recipe import DelayedScaling, Format


class FP8TensorMeta:
    """Scaling state of one direction: ``scale``, ``scale_inv``, ``amax_history``, ``amax_history_index`` (the
    attributes test_hpu_fp8_te.py lines 108-111 set)."""

    def __init__(self, tensors: int, history: int, device: torch.device) -> None:
        self.scale = torch.ones(tensors, dtype=torch.float32, device=device)
        self.scale_inv = torch.ones(tensors, dtype=torch.float32, device=device)
        self.amax_history = torch.zeros(history, tensors, dtype=torch.float32, device=device)
        self.amax_history_index = torch.zeros(1, dtype=torch.int32, device=device)

    def update(self, recipe: DelayedScaling, fp8_max: float) -> None:
        """New scales from the amax history, a power of two below ``fp8_max / amax`` less ``margin``, then the next
        history row (the rule recipe.py lines 125-132 state at commit cb252c90; amax kept where it is 0)."""
        history = self.amax_history
        row = int(self.amax_history_index[0])
        amax = history.max(dim=0).values if recipe.amax_compute_algo == "max" else history[row]
        exponent = torch.floor(torch.log2(fp8_max / amax)) - recipe.margin
        self.scale = torch.where(amax > 0.0, torch.pow(2.0, exponent), self.scale)
        self.scale_inv = torch.reciprocal(self.scale)
        if recipe.amax_history_len > 1:
            self.amax_history_index = (self.amax_history_index + 1) % recipe.amax_history_len


def _cast(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, fp8_max: float) -> torch.Tensor:
    """``x`` through fp8 and back (float32): what cast_to_fp8 then cast_from_fp8 give (test lines 113-128)."""
    return (x.float() * scale).clamp(-fp8_max, fp8_max).to(dtype).float() / scale


class _Fp8Linear(torch.autograd.Function):
    """The fp8 matrix multiplies of forward, input gradient and weight gradient (linear.py ``_Linear`` at commit
    f90046f4; test_hpu_fp8_te.py lines 408-449 compare them with casts computed on the CPU)."""

    @staticmethod
    def forward(ctx: Any, inp: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                meta: dict[str, Any], dtype: torch.dtype) -> torch.Tensor:
        """Input and weight measured into the amax history, cast with the forward scales, multiplied in the
        activation dtype (test lines 408-449)."""
        recipe, fwd = meta["recipe"], meta["scaling_fwd"]
        amaxes = torch.stack([inp.detach().abs().max().float(), weight.detach().abs().max().float()])
        fwd.amax_history[int(fwd.amax_history_index[0])] = amaxes
        fp8_dtype, fp8_max = get_fp8_te_dtype(recipe, True), recipe.fp8_format.value.max_fwd
        x8 = _cast(inp, fwd.scale[0], fp8_dtype, fp8_max).to(dtype)
        w8 = _cast(weight, fwd.scale[1], fp8_dtype, fp8_max).to(dtype)
        with torch.autocast(inp.device.type, enabled=False):
            out = x8 @ w8.t()
            if bias is not None:
                out = out + bias.to(dtype)
        hybrid = meta.get("scaling_hybrid")
        if hybrid is not None:  # HYBRID: the backward multiplies E5M2 copies of input and weight (test lines 382-394)
            hybrid.amax_history[int(hybrid.amax_history_index[0])] = amaxes
            bwd_dtype, bwd_max = get_fp8_te_dtype(recipe, False), recipe.fp8_format.value.max_bwd
            x8 = _cast(inp, hybrid.scale[0], bwd_dtype, bwd_max).to(dtype)
            w8 = _cast(weight, hybrid.scale[1], bwd_dtype, bwd_max).to(dtype)
        ctx.save_for_backward(x8, w8)
        ctx.meta, ctx.dtype, ctx.has_bias = meta, dtype, bias is not None
        ctx.input_dtype, ctx.weight_dtype = inp.dtype, weight.dtype
        ctx.bias_dtype = bias.dtype if bias is not None else None
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        """The output gradient scaled (delayed, every ``interval`` steps), measured and cast to the backward
        format; input and weight gradients from the fp8 copies (test lines 408-449)."""
        x8, w8 = ctx.saved_tensors
        meta = ctx.meta
        recipe, bwd = meta["recipe"], meta["scaling_bwd"]
        fp8_max = recipe.fp8_format.value.max_bwd
        if meta["bwd_runs"] and meta["bwd_runs"] % recipe.interval == 0:
            bwd.update(recipe, fp8_max)
        meta["bwd_runs"] += 1
        bwd.amax_history[int(bwd.amax_history_index[0]), 0] = grad.detach().abs().max().float()
        g8 = _cast(grad, bwd.scale[0], get_fp8_te_dtype(recipe, False), fp8_max).to(ctx.dtype)
        with torch.autocast(grad.device.type, enabled=False):
            grad_input = (g8 @ w8).to(ctx.input_dtype)
            flat = g8.reshape(-1, g8.shape[-1])
            grad_weight = (flat.t() @ x8.reshape(-1, x8.shape[-1])).to(ctx.weight_dtype)
            grad_bias = grad.reshape(-1, grad.shape[-1]).sum(0).to(ctx.bias_dtype) if ctx.has_bias else None
        return grad_input, grad_weight, grad_bias, None, None


class Linear(torch.nn.Module):
    """``y = x A^T + b``, "a drop-in replacement for torch.nn.Linear" on Gaudi (Intel's FP8 training page), in fp8
    inside ``fp8_autocast`` (constructor as module/linear.py ``Linear.__init__`` at commit f90046f4, called with
    these keywords in test_hpu_fp8_te.py lines 300-306; optimum-habana 1.21.2 swaps layers with it, lines 83-99)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, params_dtype: torch.dtype | None = None,
                 skip_weight_param_allocation: bool = False, device: torch.device | str = "hpu",
                 minimize_memory: bool = False, **parallelism: Any) -> None:
        super().__init__()
        hpu_standin_calls.record("te.Linear", in_features=in_features, out_features=out_features, bias=bias,
                                 skip_weight_param_allocation=skip_weight_param_allocation)
        self.in_features, self.out_features = in_features, out_features
        self.use_bias, self.minimize_memory = bias, minimize_memory
        self.fp8 = False
        self.run_cnt = 0
        self.fp8_meta: dict[str, Any] = {"recipe": DelayedScaling(), "fp8_checkpoint": False, "bwd_runs": 0}
        if not skip_weight_param_allocation:
            where = "cpu" if str(device) == "hpu" else device  # the stand-in computes in host memory
            dtype = torch.get_default_dtype() if params_dtype is None else params_dtype
            self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, device=where, dtype=dtype))
            torch.nn.init.normal_(self.weight, mean=0.0, std=0.023)
            if bias:
                self.bias = torch.nn.Parameter(torch.zeros(out_features, device=where, dtype=dtype))

    def _prepare(self, inp: torch.Tensor, recipe: DelayedScaling) -> torch.dtype:
        """The activation dtype, and fp8 meta set up or advanced (delayed scaling, every ``interval`` forwards)."""
        kind = inp.device.type
        if torch.is_autocast_enabled(kind):
            dtype = torch.get_autocast_dtype(kind)
        else:
            for name, param in self.named_parameters():
                assert inp.dtype == param.dtype, ("Data types for parameters must match when outside of autocasted "
                                                  f"region.  Found input dtype: {inp.dtype} and {name!r} dtype: "
                                                  f"{param.dtype}")
            dtype = inp.dtype
        meta = self.fp8_meta
        fwd = meta.get("scaling_fwd")
        hybrid = recipe.fp8_format == Format.HYBRID
        if fwd is None or fwd.amax_history.shape[0] != recipe.amax_history_len or hybrid != ("scaling_hybrid" in meta):
            meta["scaling_fwd"] = FP8TensorMeta(2, recipe.amax_history_len, inp.device)
            meta["scaling_bwd"] = FP8TensorMeta(1, recipe.amax_history_len, inp.device)
            meta.pop("scaling_hybrid", None)
            if hybrid:
                meta["scaling_hybrid"] = FP8TensorMeta(2, recipe.amax_history_len, inp.device)
        elif self.run_cnt % recipe.interval == 0:
            fwd.update(recipe, recipe.fp8_format.value.max_fwd)
            if hybrid:
                meta["scaling_hybrid"].update(recipe, recipe.fp8_format.value.max_bwd)
        meta["recipe"] = recipe
        self.run_cnt += 1
        return dtype

    def forward(self, inp: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                is_first_microbatch: bool | None = None) -> torch.Tensor:
        """The linear map; fp8 matrix multiplies inside ``fp8_autocast(enabled=True)`` (linear.py ``Linear.forward``
        at commit f90046f4; plain ``F.linear`` outside, test lines 272-357)."""
        weight_tensor = weight if weight is not None else self.weight
        bias_tensor = bias if bias is not None else (self.bias if self.use_bias else None)
        if not FP8GlobalStateManager.is_fp8_enabled():
            return torch.nn.functional.linear(inp, weight_tensor, bias_tensor)
        self.fp8 = True
        dtype = self._prepare(inp, FP8GlobalStateManager.get_fp8_recipe())
        hpu_standin_calls.record("te.Linear.fp8_forward", in_features=self.in_features,
                                 out_features=self.out_features)
        return _Fp8Linear.apply(inp, weight_tensor, bias_tensor, self.fp8_meta, dtype)

    def get_extra_state(self) -> torch.Tensor:
        """The fp8 meta (scales, amax histories and indices, counters) pickled into a uint8 tensor, ``None`` pickled
        before any fp8 forward (base.py ``get_extra_state`` at commit ac47fb7c; read back as test lines 1981-1993)."""
        state = None
        if self.fp8 or self.fp8_meta["fp8_checkpoint"]:
            state = {}
            for key, suffix in (("scaling_fwd", "fwd"), ("scaling_hybrid", "hybrid"), ("scaling_bwd", "bwd")):
                meta = self.fp8_meta.get(key)
                if meta is None:
                    continue
                state[f"scale_{suffix}"] = meta.scale
                state[f"scale_inv_{suffix}"] = meta.scale_inv
                state[f"amax_history_{suffix}"] = meta.amax_history
                state[f"amax_history_index_{suffix}"] = meta.amax_history_index
            state["extra_fp8_variables"] = {"run_cnt": self.run_cnt, "bwd_runs": self.fp8_meta["bwd_runs"]}
        return torch.tensor(np.frombuffer(pickle.dumps(state), dtype=np.uint8))

    def set_extra_state(self, state: Any) -> None:
        """Restore what `get_extra_state` saved; ``None`` (or a pickled ``None``) restores nothing (base.py
        ``set_extra_state`` at commit ac47fb7c; round trip as test_hpu_fp8_te.py lines 1163-1219)."""
        if state is None:
            return
        if isinstance(state, torch.Tensor):
            state = pickle.loads(state.detach().cpu().numpy().tobytes())  # the vendor's format
        if state is None:
            return
        self.run_cnt = state["extra_fp8_variables"]["run_cnt"]
        self.fp8_meta["bwd_runs"] = state["extra_fp8_variables"]["bwd_runs"]
        self.fp8_meta.pop("scaling_hybrid", None)
        directions = (("scaling_fwd", "fwd", 2), ("scaling_hybrid", "hybrid", 2), ("scaling_bwd", "bwd", 1))
        for key, suffix, tensors in directions:
            if f"amax_history_{suffix}" not in state:
                continue
            history = state[f"amax_history_{suffix}"]
            meta = FP8TensorMeta(tensors, history.shape[0], history.device)
            meta.scale, meta.scale_inv = state[f"scale_{suffix}"].clone(), state[f"scale_inv_{suffix}"].clone()
            meta.amax_history = history.clone()
            meta.amax_history_index = state[f"amax_history_index_{suffix}"].clone()
            self.fp8_meta[key] = meta

    def extra_repr(self) -> str:
        """As ``nn.Linear`` prints itself (test_hpu_fp8_te.py lines 203-206 mirror it)."""
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.use_bias}"
