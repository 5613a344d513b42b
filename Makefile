# Every target creates .venv with pip when it is missing (torch comes from the local wheel disk;
# uv and poetry would download GBs of CUDA wheels instead), installs devplug editable, and runs.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.14.1 torchvision==0.29.1
STAMP  := $(VENV)/.devplug-installed
ARGS   ?=

.PHONY: venv test demo lint bench devices clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -q $(ARGS)

demo: $(STAMP)
	$(PY) examples/dcgan.py $(ARGS)

devices: $(STAMP)
	$(VENV)/bin/devplug devices --verbose

bench: $(STAMP)
	$(PY) benchmarks/run_all.py  # each script takes its own flags: python benchmarks/NAME.py --help

lint: $(STAMP)
	$(PY) -m ruff check .

clean:
	rm -rf $(VENV) runs .pytest_cache
