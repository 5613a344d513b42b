# Every target creates .venv with pip when it is missing (torch comes from the local wheel disk;
# uv and poetry would download GBs of CUDA wheels instead), installs devplug editable, and runs.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.14.1 torchvision==0.29.1
STAMP  := $(VENV)/.devplug-installed
ARGS   ?=

.PHONY: venv test demo lint bench devices check-device docs clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[dev]'
	# Habana's own clients, read (never imported) by the Gaudi plugin's tests as the vendor's practice: they
	# need the Gaudi bridge to import, so they come without their dependencies
	$(PY) -m pip install -q --no-deps lightning-habana==1.6.0 optimum-habana==1.21.2
	touch $(STAMP)

# Two workers, each test module on one of them (--dist loadscope: a module's fixtures are built once); the 15
# slowest tests are listed at the end, so growth shows. TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 2
test: lint
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadscope --durations=15 $(ARGS)

demo: $(STAMP)
	$(PY) examples/dcgan.py $(ARGS)

devices: $(STAMP)
	$(VENV)/bin/devplug devices --verbose

# On a machine with an accelerator: the device-dependent tests (cuda, mps, xpu, npu, other accelerators;
# each skips without its hardware), the DCGAN example on the best device here, then the benchmarks.
check-device: $(STAMP)
	$(VENV)/bin/devplug devices
	$(PY) -m pytest -q -rs -m "cuda or mps or xpu or npu or accelerator" $(ARGS)
	$(PY) examples/dcgan.py --device auto --steps 200 --log-every 50 --no-progress --out runs/check-device
	$(PY) benchmarks/run_all.py

bench: $(STAMP)
	$(PY) -m pip install -q -e '.[bench]'  # Lightning Fabric and HF Accelerate, the peers of benchmarks/peers.py
	$(PY) benchmarks/run_all.py  # each script takes its own flags: python benchmarks/NAME.py --help

# The documentation site (MkDocs + Material, API reference from the docstrings), strict: a broken link,
# anchor or reference fails. Output in site/. NO_MKDOCS_2_WARNING silences Material's end-of-life notice
# (May 5, 2027); what we do about it is written in README.md, "Supported versions".
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

# ruff; deptry: every package devplug/ imports is declared in pyproject.toml, nothing declared goes unused
# ([tool.deptry]; offline); then mypy over devplug/: strict on the public modules, and elsewhere no error
# beyond mypy-baseline.txt (python tests/test_typecheck.py --update records fixed ones).
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m deptry .
	$(PY) tests/test_typecheck.py

clean:
	rm -rf $(VENV) runs site .pytest_cache .mypy_cache
