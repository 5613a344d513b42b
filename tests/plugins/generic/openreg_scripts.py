"""Code the openreg tests run in child processes (the backend never loads in the test process)."""

MLP_LOSSES = """
import json, sys, torch, devplug
from toys import make_model, make_data

def losses(device):
    trainer = devplug.Trainer(device=device, precision="32-true", progress=False)
    model = trainer.setup(make_model())
    opt = trainer.optimizer("adam", model.parameters(), lr=0.01)
    loader = trainer.dataloader(make_data(32), batch_size=8, num_workers=0)
    seen = []
    for _ in trainer.epochs(2):
        for x, y in loader:
            assert x.device.type == trainer.torch_device.type
            loss = torch.nn.functional.mse_loss(model(x), y)
            trainer.backward(loss)
            trainer.step(opt)
            seen.append(loss.item())
    trainer.close()
    return {"device": str(trainer.torch_device), "plugin": trainer.device.plugin_name, "losses": seen}

print(json.dumps([losses("openreg"), losses("cpu")]))
"""

CROSS_DEVICE_RESUME = """
import json, sys, torch, devplug
from toys import make_model, make_data

def run(device, steps, load=None, save=None):
    trainer = devplug.Trainer(device=device, precision="32-true", progress=False)
    model = trainer.setup(make_model(seed=3))
    opt = trainer.optimizer("adamw", model.parameters(), lr=0.01)
    if load:
        trainer.load(load)
    loader = trainer.dataloader(make_data(32), batch_size=8, num_workers=0)
    seen = []
    for x, y in loader:
        if len(seen) == steps:
            break
        loss = torch.nn.functional.mse_loss(model(x), y)
        trainer.backward(loss)
        trainer.step(opt)
        seen.append(loss.item())
    if save:
        trainer.save(save)
    weights = [p.detach().cpu() for p in model.parameters()]
    trainer.close()
    return seen, weights

folder = sys.argv[1]
_, on_device = run("openreg", 2, save=folder + "/dev.pt")
_, on_cpu = run("cpu", 0, load=folder + "/dev.pt", save=folder + "/cpu.pt")
_, back = run("openreg", 0, load=folder + "/cpu.pt")
later_cpu, _ = run("cpu", 1, load=folder + "/dev.pt")
later_dev, _ = run("openreg", 1, load=folder + "/dev.pt")
same = all(torch.equal(a, b) and torch.equal(a, c) for a, b, c in zip(on_device, on_cpu, back))
print(json.dumps({"same": same, "later_cpu": later_cpu, "later_dev": later_dev}))
"""

SAVE_ON_DEVICE = """
import sys, torch, devplug
from toys import make_model
trainer = devplug.Trainer(device="openreg", precision="32-true", progress=False)
model = trainer.setup(make_model())
opt = trainer.optimizer("sgd", model.parameters(), lr=0.1)
loss = model(torch.ones(2, 6, device="openreg")).sum()
trainer.backward(loss)
trainer.step(opt)
print("saved", trainer.save(sys.argv[1]))
with torch.no_grad():
    next(model.parameters())[0, 0] = float("nan")
try:
    trainer.save(sys.argv[1] + ".nan")
except devplug.DevplugError as exc:
    print("refused:", exc)
"""

LOADER = """
import sys, torch, devplug
from toys import make_data
trainer = devplug.Trainer(device="openreg", progress=False)
pin = {"default": None, "on": True, "off": False}[sys.argv[1]]
workers = int(sys.argv[2]) if len(sys.argv) > 2 else 0
try:
    loader = trainer.dataloader(make_data(16), batch_size=8, num_workers=workers, pin_memory=pin)
except devplug.DevplugError as exc:
    print("refused:", exc)
    raise SystemExit(2)
if workers:  # what was chosen, without starting the worker processes
    print("built", loader.choice.implementation)
else:
    print("batches", [tuple(x.shape) for x, _ in loader], loader.choice.implementation)
"""

PRECISION = """
import sys, devplug
try:
    trainer = devplug.Trainer(device="openreg", precision=sys.argv[1], progress=False)
except devplug.DevplugError as exc:
    print("refused:", type(exc).__name__, exc)
    raise SystemExit(2)
print("plan", trainer.precision.name, trainer.precision.description)
"""

AUTO = """
import devplug
trainer = devplug.Trainer(device="auto", progress=False)
print("chose", trainer.device.name)
"""
