"""Contract tests of the Gaudi (HPU) plugin, run against the stand-in of the Intel Gaudi packages.

The stand-in (tests/standins/hpu_standin) mirrors the documented module paths and signatures and
records every call, so these tests check what the plugin asks of the Gaudi stack: mark_step exactly
after backward and after each optimizer step in lazy mode and never in eager mode, FusedAdamW built
with the author's options, HMP converted once with every optimizer step inside disable_casts, bf16
autocast otherwise, HCCL through initialize_distributed_hpu, HabanaDataLoader for image folders.
"""

from __future__ import annotations

import importlib.metadata
import logging
import sys
from pathlib import Path

import pytest
import torch
from standins import hpu_fixtures
from torch import nn
from torch.utils.data import TensorDataset

import devplug
from devplug.core.contract import hookspecs
from devplug.core.contract.records import Device, ImageFolderSource, LaunchInfo, LoaderOptions, Phase
from devplug.core.registry.devices import DeviceRegistry
from devplug.plugins.hpu import precision, runtime

# The stand-in computes on the CPU, where torch ignores pinned memory (and says so).
pytestmark = pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true:UserWarning")

FUSED_ADAMW = "habana_frameworks.torch.hpex.optimizers.FusedAdamW"
NZ = 8


@pytest.fixture
def hpu(monkeypatch: pytest.MonkeyPatch):
    """The stand-in Gaudi stack, lazy mode, one device."""
    yield from hpu_fixtures.standin(monkeypatch)


# ---- a DCGAN-like training step through the Trainer ------------------------------------------------------
class Generator(nn.Module):
    """Noise (N, NZ, 1, 1) to images (N, 3, 8, 8)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.ConvTranspose2d(NZ, 16, 4, 1, 0, bias=False), nn.BatchNorm2d(16), nn.ReLU(True),
            nn.ConvTranspose2d(16, 3, 4, 2, 1, bias=False), nn.Tanh(),
        )

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z)


class Discriminator(nn.Module):
    """Images (N, 3, 8, 8) to one logit each."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 16, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, True), nn.Conv2d(16, 1, 4, 1, 0, bias=False),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).flatten()


def train_dcgan(trainer: devplug.Trainer, steps: int = 2) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer]:
    """The author's GAN loop (two optimizers, manual control) for ``steps`` iterations."""
    torch.manual_seed(0)
    net_g, net_d = trainer.setup(Generator()), trainer.setup(Discriminator())
    opt_g = trainer.optimizer("adam", net_g.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_d = trainer.optimizer("adam", net_d.parameters(), lr=2e-4, betas=(0.5, 0.999))
    loader = trainer.dataloader(TensorDataset(torch.rand(4 * steps, 3, 8, 8) * 2 - 1, torch.zeros(4 * steps)),
                                batch_size=4, num_workers=0)
    bce = nn.BCEWithLogitsLoss()
    for _epoch in trainer.epochs(1):
        for real, _ in loader:
            ones = torch.ones(real.shape[0], device=trainer.torch_device)
            noise = torch.randn(real.shape[0], NZ, 1, 1, device=trainer.torch_device)
            net_d.zero_grad(set_to_none=True)
            with trainer.autocast():
                fake = net_g(noise)
                loss_d = bce(net_d(real).float(), ones) + bce(net_d(fake.detach()).float(), 1 - ones)
            trainer.backward(loss_d)
            trainer.step(opt_d)
            with trainer.autocast():
                loss_g = bce(net_d(fake).float(), ones)
            trainer.backward(loss_g)
            trainer.step(opt_g)
            trainer.log(loss_d=loss_d, loss_g=loss_g)
    return opt_g, opt_d


def make_trainer(hpu: hpu_fixtures.StandIn, **options: object) -> devplug.Trainer:
    options.setdefault("precision", "auto")
    return devplug.Trainer(device="hpu", progress=False, plugin_manager=hpu.plugin_manager(), **options)


def step_calls(hpu: hpu_fixtures.StandIn) -> list[str]:
    return [n for n in hpu.names() if n == "mark_step" or n.endswith(".step") or n.startswith("hmp.disable")]


def test_dcgan_lazy_mode_marks_step_after_backward_and_after_each_optimizer_step(hpu):
    trainer = make_trainer(hpu)
    train_dcgan(trainer, steps=2)
    steps = hpu.count("FusedAdamW.step")
    assert steps == 4  # 2 iterations x (discriminator + generator)
    assert hpu.count("mark_step") == 2 * steps
    one_optimizer_step = ["mark_step", "FusedAdamW.step", "mark_step"]
    assert step_calls(hpu) == one_optimizer_step * steps


def test_dcgan_eager_mode_never_marks_steps(hpu):
    hpu.lazy(False)
    trainer = make_trainer(hpu)
    train_dcgan(trainer, steps=2)
    assert hpu.count("FusedAdamW.step") == 4
    assert hpu.count("mark_step") == 0


def test_dcgan_adam_runs_on_fused_adamw_with_the_authors_options(hpu):
    trainer = make_trainer(hpu)
    opt_g, opt_d = train_dcgan(trainer, steps=1)
    # Adam's defaults filled in from torch (eps 1e-8, not FusedAdamW's 1e-6); weight_decay 0 makes it exact Adam.
    expected = {"lr": 2e-4, "betas": (0.5, 0.999), "eps": 1e-8, "weight_decay": 0, "bias_correction": True}
    assert hpu.details("FusedAdamW") == [expected, expected]
    assert trainer.optimizer_implementation(opt_g) == f"{FUSED_ADAMW}(weight_decay=0) as Adam"
    assert type(opt_d).__name__ == "FusedAdamW"


def test_dcgan_hmp_converts_once_and_wraps_every_optimizer_step_in_disable_casts(hpu):
    trainer = make_trainer(hpu, precision="hmp")
    train_dcgan(trainer, steps=2)
    assert hpu.count("hmp.convert") == 1  # two modules set up, torch patched once
    assert hpu.details("hmp.convert") == [{"opt_level": "O1", "bf16_ops": None, "fp32_ops": None, "isVerbose": False}]
    wrapped = ["hmp.disable_casts.enter", "FusedAdamW.step", "hmp.disable_casts.exit"]
    assert [n for n in step_calls(hpu) if n != "mark_step"] == wrapped * 4
    assert trainer.precision.name == "bf16-mixed" and "Habana Mixed Precision" in trainer.precision.description
    assert trainer.scaler is None


def test_hmp_from_device_options_with_op_lists(hpu, tmp_path):
    fp32_file = tmp_path / "fp32.txt"
    fp32_file.write_text("binary_cross_entropy_with_logits\n")
    settings = {"opt_level": "O1", "bf16_ops": ["conv2d", "conv_transpose2d"], "fp32_ops": str(fp32_file),
                "verbose": True}
    trainer = make_trainer(hpu, device_options={"hmp": settings})
    trainer.setup(Discriminator())
    assert hpu.details("hmp.convert") == [
        {"opt_level": "O1", "bf16_ops": ["conv2d", "conv_transpose2d"],
         "fp32_ops": ["binary_cross_entropy_with_logits"], "isVerbose": True}
    ]


def test_a_second_trainer_asking_other_hmp_settings_is_refused_rather_than_left_on_the_first(hpu):
    """hmp.convert patches torch once per process: a later Trainer with other settings would run the first's
    while its plan described its own."""
    first = make_trainer(hpu, precision="hmp")
    first.setup(Discriminator())
    same = make_trainer(hpu, device_options={"hmp": True})  # the same settings: nothing to convert again
    same.setup(Discriminator())
    with pytest.raises(devplug.PrecisionError, match=r"opt_level=O1.*new process"):
        make_trainer(hpu, device_options={"hmp": "O2"})
    assert hpu.count("hmp.convert") == 1


def test_autocast_when_hmp_is_absent(hpu):
    hpu.remove("habana_frameworks.torch.hpex.hmp")
    trainer = make_trainer(hpu)
    train_dcgan(trainer, steps=1)
    assert trainer.precision.name == "bf16-mixed"
    assert trainer.precision.description.startswith("torch.autocast(")
    assert trainer.precision.convert_module is None and trainer.precision.optimizer_step_context is None
    assert not [n for n in hpu.names() if n.startswith("hmp.")]


def test_asking_for_hmp_where_it_is_absent_is_a_clear_error(hpu):
    hpu.remove("habana_frameworks.torch.hpex.hmp")
    with pytest.raises(devplug.PrecisionError, match=r"hpex\.hmp.*precision='bf16-mixed'"):
        make_trainer(hpu, precision="hmp")


def test_dataloader_through_the_trainer_uses_habana_dataloader_for_an_image_folder(hpu, tmp_path):
    root = image_folder(tmp_path)
    trainer = make_trainer(hpu)
    loader = trainer.dataloader(ImageFolderSource(str(root), image_size=8), batch_size=2, shuffle=True, num_workers=0)
    assert loader.implementation.startswith("HabanaDataLoader(Gaudi 2 media pipeline")
    (call,) = hpu.details("HabanaDataLoader")
    assert call["dataset"] == "ImageFolder" and call["shuffle"] is True and call["batch_size"] == 2
    images, labels = next(iter(loader))
    assert images.shape == (2, 3, 8, 8) and labels.shape == (2,)


# ---- the plan records themselves -------------------------------------------------------------------------
def hpu_device(**options: object) -> Device:
    """A Device record exactly as on a Gaudi machine (torch type "hpu")."""
    registry_spec = devplug.DeviceSpec(name="hpu", description="Gaudi", priority=100, probe=devplug.Availability.yes)
    return Device(spec=registry_spec, index=None, plugin_name="hpu", options=options)


def test_bf16_plan_is_torch_autocast_on_hpu_without_a_scaler():
    for name in ("auto", "bf16-mixed"):
        plan = precision.plan_precision(hpu_device(), name)
        context = plan.autocast()
        assert isinstance(context, torch.autocast)
        assert (context.device, context.fast_dtype) == ("hpu", torch.bfloat16)
        assert plan.scaler is None and plan.name == "bf16-mixed"
    assert precision.plan_precision(hpu_device(), "32-true").name == "32-true"


def test_fp16_with_a_grad_scaler_is_refused_with_advice():
    with pytest.raises(devplug.PrecisionError, match="bf16-mixed"):
        precision.plan_precision(hpu_device(), "16-mixed")


def test_hmp_option_conflicting_with_fp32_is_refused(hpu):
    with pytest.raises(devplug.PrecisionError, match="hmp"):
        precision.plan_precision(hpu_device(hmp=True), "32-true")
    with pytest.raises(devplug.PrecisionError, match="opt_level"):
        precision.plan_precision(hpu_device(hmp="O3"), "auto")


# ---- step marking and execution mode at hook level ---------------------------------------------------------
def test_htcore_is_imported_only_when_the_device_is_set_up(hpu):
    DeviceRegistry(hpu.plugin_manager())  # registration: no vendor import
    assert "habana_frameworks" not in sys.modules
    hooks = hpu.hooks()
    assert runtime.state().htcore is None
    hooks(hookspecs.devplug_device_setup)
    assert runtime.state().htcore is sys.modules["habana_frameworks.torch.core"]
    assert runtime.state().lazy is True


@pytest.mark.parametrize(("lazy", "expected"), [(True, 2), (False, 0)])
def test_mark_step_hook_by_mode(hpu, lazy, expected):
    hpu.lazy(lazy)
    hooks = hpu.hooks()
    hooks(hookspecs.devplug_device_setup)
    hooks(hookspecs.devplug_mark_step, phase=Phase.BACKWARD)
    hooks(hookspecs.devplug_mark_step, phase=Phase.OPTIMIZER_STEP)
    assert hpu.count("mark_step") == expected


@pytest.mark.parametrize(("version", "lazy"), [("1.20.1", True), ("1.21.0", False)])
def test_without_is_lazy_the_release_default_decides(hpu, monkeypatch, version, lazy):
    hpu.remove("habana_frameworks.torch.utils.internal")
    monkeypatch.delenv("PT_HPU_LAZY_MODE")
    import habana_frameworks.torch

    # The bridge has no __version__ (the stand-in neither): its release is its distribution's metadata.
    assert not hasattr(habana_frameworks.torch, "__version__")
    real_version = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: version if name == "habana-torch-plugin" else real_version(name))
    hooks = hpu.hooks()
    hooks(hookspecs.devplug_device_setup)
    assert runtime.state().lazy is lazy


def test_compile_uses_hpu_backend_in_eager_mode_only(hpu):
    hpu.lazy(False)
    hooks = hpu.hooks()
    hooks(hookspecs.devplug_device_setup)
    module = nn.Linear(4, 2)
    compiled = hooks(hookspecs.devplug_compile, module=module, options={})
    assert compiled is not module and compiled._orig_mod is module
    compiled(torch.randn(3, 4))
    assert hpu.count("hpu_backend") == 1


def test_compile_is_skipped_in_lazy_mode(hpu):
    hooks = hpu.hooks()
    module = nn.Linear(4, 2)
    assert hooks(hookspecs.devplug_compile, module=module, options={}) is module


def test_compile_plan_is_none_in_lazy_mode_saying_how_to_switch(hpu):
    lazy = hpu.hooks()(hookspecs.devplug_compile_plan)
    assert lazy.backend is None and "PT_HPU_LAZY_MODE=0" in lazy.reason


def test_compile_plan_is_hpu_backend_in_eager_mode(hpu):
    hpu.lazy(False)
    hooks = hpu.hooks()
    hooks(hookspecs.devplug_device_setup)
    assert hooks(hookspecs.devplug_compile_plan).backend == "hpu_backend"


# ---- optimizers ----------------------------------------------------------------------------------------------
def params() -> list[nn.Parameter]:
    return list(nn.Linear(4, 2).parameters())


def test_adamw_maps_every_option_with_torch_defaults(hpu):
    choice = hpu.hooks()(hookspecs.devplug_optimizer, name="adamw", params=params(),
                         options={"lr": 1e-3, "foreach": True})
    assert choice.implementation == FUSED_ADAMW and not choice.reason
    assert hpu.details("FusedAdamW") == [
        {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01, "bias_correction": True}
    ]


def test_adam_with_l2_weight_decay_stays_torch_adam(hpu):
    choice = hpu.hooks()(hookspecs.devplug_optimizer, name="adam", params=params(),
                         options={"lr": 1e-3, "weight_decay": 1e-4})
    assert isinstance(choice.optimizer, torch.optim.Adam) and choice.implementation == "torch.optim.Adam"
    assert "L2" in choice.reason and "adamw" in choice.reason
    assert hpu.count("FusedAdamW") == 0


def test_adam_with_l2_weight_decay_in_a_param_group_stays_torch_adam(hpu):
    groups = [{"params": params(), "weight_decay": 1e-2}, {"params": params()}]
    choice = hpu.hooks()(hookspecs.devplug_optimizer, name="adam", params=groups, options={"lr": 1e-3})
    assert isinstance(choice.optimizer, torch.optim.Adam)


def test_adam_with_decoupled_weight_decay_is_fused_adamw(hpu):
    options = {"lr": 1e-3, "weight_decay": 0.05, "decoupled_weight_decay": True}
    choice = hpu.hooks()(hookspecs.devplug_optimizer, name="adam", params=params(), options=options)
    assert choice.implementation == f"{FUSED_ADAMW}(weight_decay=0.05) as Adam"
    assert hpu.details("FusedAdamW")[0]["weight_decay"] == 0.05


def test_options_the_fused_kernel_lacks_fall_back_to_torch(hpu):
    choice = hpu.hooks()(hookspecs.devplug_optimizer, name="adamw", params=params(), options={"amsgrad": True})
    assert isinstance(choice.optimizer, torch.optim.AdamW) and "amsgrad=True" in choice.reason


def test_sgd_is_fused_sgd(hpu):
    options = {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-4}
    choice = hpu.hooks()(hookspecs.devplug_optimizer, name="sgd", params=params(), options=options)
    assert choice.implementation == "habana_frameworks.torch.hpex.optimizers.FusedSGD"
    assert hpu.details("FusedSGD") == [
        {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4, "dampening": 0, "nesterov": True}
    ]


def test_other_optimizers_are_left_to_torch(hpu):
    choice = hpu.hooks()(hookspecs.devplug_optimizer, name="rmsprop", params=params(), options={"lr": 1e-3})
    assert type(choice.optimizer) is torch.optim.RMSprop  # the core fallback's torch kernel, not an hpex one
    assert choice.implementation.startswith("torch.optim.RMSprop")


def test_torch_optimizers_with_a_logged_reason_when_hpex_is_missing(hpu, caplog):
    hpu.remove("habana_frameworks.torch.hpex.optimizers")
    hooks = hpu.hooks()
    with caplog.at_level(logging.WARNING, logger="devplug.plugins.hpu"):
        first = hooks(hookspecs.devplug_optimizer, name="adamw", params=params(), options={"lr": 1e-3})
        hooks(hookspecs.devplug_optimizer, name="adamw", params=params(), options={"lr": 1e-3})
    assert isinstance(first.optimizer, torch.optim.AdamW)
    assert "hpex.optimizers.FusedAdamW is not available" in first.reason
    assert len([r for r in caplog.records if "FusedAdamW is not available" in r.getMessage()]) == 1


# ---- collectives ---------------------------------------------------------------------------------------------
DDP_DEFAULTS = {"bucket_cap_mb": 100, "gradient_as_bucket_view": True, "broadcast_buffers": False}


def set_env(monkeypatch: pytest.MonkeyPatch, **variables: str) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)


def test_torchrun_launch_uses_hccl_and_initialize_distributed_hpu(hpu, monkeypatch):
    set_env(monkeypatch, WORLD_SIZE="2", RANK="1", LOCAL_RANK="1")
    hooks = hpu.hooks()
    hpu.reset()
    launch = LaunchInfo(rank=1, world_size=2, local_rank=1, local_world_size=2, launcher="torchrun")
    setup = hooks(hookspecs.devplug_collective_setup, launch=launch)
    assert setup.backend == "hccl" and "hccl" in torch.distributed.Backend.backend_list
    assert dict(setup.ddp_kwargs) == DDP_DEFAULTS  # no device_ids: one card per process
    assert dict(setup.init_kwargs) == {"rank": 1, "world_size": 2}
    assert hpu.details("initialize_distributed_hpu") == [{"world_size": 2, "rank": 1, "local_rank": 1}]


def test_mpirun_launch_and_bucket_size_option(hpu, monkeypatch):
    set_env(monkeypatch, OMPI_COMM_WORLD_SIZE="2", OMPI_COMM_WORLD_RANK="0", OMPI_COMM_WORLD_LOCAL_RANK="0")
    hooks = hpu.hooks(bucket_cap_mb=200)
    launch = LaunchInfo(rank=0, world_size=2, local_rank=0, local_world_size=2, launcher="openmpi")
    setup = hooks(hookspecs.devplug_collective_setup, launch=launch)
    assert setup.backend == "hccl" and dict(setup.ddp_kwargs) == {**DDP_DEFAULTS, "bucket_cap_mb": 200}
    assert dict(setup.init_kwargs) == {"rank": 0, "world_size": 2}
    assert hpu.details("initialize_distributed_hpu")[-1] == {"world_size": 2, "rank": 0, "local_rank": 0}


def test_srun_launch_is_handed_to_initialize_distributed_hpu(hpu):
    hooks = hpu.hooks()
    hpu.reset()
    launch = LaunchInfo(rank=3, world_size=4, local_rank=1, local_world_size=2, launcher="slurm")
    setup = hooks(hookspecs.devplug_collective_setup, launch=launch)
    assert dict(setup.init_kwargs) == {"rank": 3, "world_size": 4}
    assert hpu.details("initialize_distributed_hpu") == [
        {"world_size": 1, "rank": -1, "local_rank": -1},  # Habana does not read SLURM's variables ...
        {"world_size": 4, "rank": 3, "local_rank": 1},  # ... so devplug hands it the launch it read
    ]


def test_disagreeing_launch_readings_are_an_error(hpu, monkeypatch):
    set_env(monkeypatch, WORLD_SIZE="2", RANK="0", LOCAL_RANK="0")
    with pytest.raises(devplug.ConfigError, match="initialize_distributed_hpu"):
        hpu.hooks()(hookspecs.devplug_collective_setup, launch=LaunchInfo(rank=1, world_size=2, local_rank=1))


# ---- data loading --------------------------------------------------------------------------------------------
def image_folder(tmp_path: Path, flat: bool = False, suffix: str = ".jpg") -> Path:
    from PIL import Image

    root = tmp_path / "images"
    for cls in ("a", "b"):
        folder = root if flat else root / cls
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(2):
            Image.new("RGB", (12, 10), (40 * i, 80, 120)).save(folder / f"{cls}{i}{suffix}")
    return root


def test_habana_dataloader_media_path_gets_no_sampler_it_would_ignore(hpu, tmp_path):
    # The media pipeline ignores a sampler and shards by rank itself: devplug does not pretend otherwise.
    options = LoaderOptions(batch_size=2, shuffle=True, world_size=2, rank=1, num_workers=2)
    choice = hpu.hooks()(hookspecs.devplug_dataloader, source=ImageFolderSource(str(image_folder(tmp_path)), 8),
                         options=options)
    (call,) = hpu.details("HabanaDataLoader")
    assert "sampler" not in call and call["shuffle"] is True
    assert call["prefetch_factor"] == 2 and "persistent_workers" not in call and call["num_workers"] == 2
    assert choice.sampler is None and not choice.on_device
    assert hpu.details("HabanaDataLoader.path") == [{"path": "media", "error": ""}]


def test_torch_loader_with_reason_for_other_datasets(hpu, caplog):
    hooks = hpu.hooks()
    dataset = TensorDataset(torch.zeros(4, 3))
    with caplog.at_level(logging.INFO, logger="devplug.plugins.hpu"):
        choice = hooks(hookspecs.devplug_dataloader, source=dataset, options=LoaderOptions(batch_size=2))
        hooks(hookspecs.devplug_dataloader, source=dataset, options=LoaderOptions(batch_size=2))
    assert choice.implementation == "torch DataLoader(workers=0, pin_memory=False)"  # none pinned in the main process
    assert "not TensorDataset" in choice.reason and "not pinned, no worker processes" in choice.reason
    with_workers = hooks(hookspecs.devplug_dataloader, source=dataset, options=LoaderOptions(batch_size=2,
                                                                                          num_workers=2))
    assert with_workers.implementation == "torch DataLoader(workers=2, pin_memory=True)"  # on the loader's thread
    assert len([r for r in caplog.records if "not TensorDataset" in r.getMessage()]) == 1
    assert hpu.count("HabanaDataLoader") == 0


def test_torch_loader_for_a_flat_folder_or_without_habana_dataloader(hpu, tmp_path):
    hooks = hpu.hooks()
    flat = hooks(hookspecs.devplug_dataloader, source=ImageFolderSource(str(image_folder(tmp_path, flat=True)), 8),
                                    options=LoaderOptions(batch_size=2, pin_memory=False))
    assert "one sub-folder per class" in flat.reason and "pin_memory=False" in flat.implementation
    hpu.remove("habana_dataloader")
    folders = hooks(hookspecs.devplug_dataloader, source=ImageFolderSource(str(image_folder(tmp_path / "b")), 8),
                                       options=LoaderOptions(batch_size=2))
    assert "habana_dataloader is not available" in folders.reason
    assert hpu.count("HabanaDataLoader") == 0


# ---- synchronize and memory ----------------------------------------------------------------------------------
def test_synchronize_and_memory_stats_come_from_torch_hpu(hpu):
    hooks = hpu.hooks()
    assert hooks(hookspecs.devplug_synchronize) is True and hpu.count("hpu.synchronize") == 1
    stats = hooks(hookspecs.devplug_memory_stats)
    assert stats == devplug.MemoryStats(allocated=3 * 2**20, reserved=96 * 2**30, peak_allocated=5 * 2**20,
                                        total=96 * 2**30)


def test_sharding_is_refused_in_lazy_mode_with_the_switch_to_eager(hpu):
    plan = hpu.hooks()(hookspecs.devplug_sharding, precision="bf16-mixed")
    assert not plan.supported and plan.reason.startswith("hpu")
    assert "PT_HPU_LAZY_MODE=0" in plan.reason and "strategy='ddp'" in plan.reason and "\n" not in plan.reason
    with pytest.raises(devplug.ConfigError, match="strategy='fsdp' is not available: hpu"):
        devplug.Trainer(device="hpu", strategy="fsdp", progress=False, plugin_manager=hpu.plugin_manager())


def test_sharding_in_eager_mode_gathers_bf16_over_hccl_with_torch_foreach(hpu):
    hpu.lazy(False)
    plan = hpu.hooks()(hookspecs.devplug_sharding, precision="bf16-mixed")
    assert plan.supported and (plan.param_dtype, plan.reduce_dtype) == (torch.bfloat16, torch.float32)
    assert (plan.optimizer_kernel, plan.cpu_offload) == ("foreach", False) and "FusedAdamW" in plan.optimizer_reason
    assert "hccl" in plan.reason


def test_clipping_sharded_gradients_leaves_the_fused_kernel_to_unsharded_runs(hpu):
    from devplug.plugins.hpu import clipping

    class Sharded(torch.Tensor):
        placements = ()

    param = nn.Parameter(torch.ones(2))
    param.grad = torch.ones(2).as_subclass(Sharded)
    assert clipping.clip_grad_norm(hpu.device(), [param], 1.0, 2.0) is None
    assert hpu.count("FusedClipNorm") == 0
