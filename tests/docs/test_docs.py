"""The hook reference is generated from the hookspec docstrings and must not drift from them."""

import inspect
import re
from pathlib import Path

import pytest
from paths import REPO

from devplug import docgen
from devplug.core.contract import hookspecs

DOCS = REPO / "docs"


def test_generated_docs_match_the_code():
    for path, text in docgen.outputs(DOCS).items():
        assert path.read_text() == text, f"{path} is stale: run `python -m devplug.docgen`"


def test_plugins_page_tables_are_generated_from_the_contract_and_the_kit():
    page = (DOCS / "plugins.md").read_text()
    for fn in hookspecs.HOOKS:
        assert f"| [`{fn.__name__}`](hooks.md#{fn.__name__}) |" in page
    assert "| `test_optimizer[adam/adamw/sgd]` | `devplug_optimizer` |" in page


def test_generated_docs_name_public_objects_not_private_modules():
    assert docgen.public_name("devplug.core.contract.records.PrecisionPlan") == "devplug.PrecisionPlan"
    assert docgen.public_name("devplug.core.data.tuning.tune_loader") == "devplug.toolkit.tune_loader"
    assert docgen.public_names("a `Device`.") == "a `Device`."
    with pytest.raises(ValueError, match="private"):
        docgen.public_name("devplug.core.fallback.plugin")  # a module no public name exports
    for page in DOCS.rglob("*.md"):
        assert "devplug.core" not in page.read_text(), f"{page.name} names a private module"


def test_every_hook_documents_when_called_and_what_it_returns():
    for name, fn in vars(hookspecs).items():
        if name.startswith("devplug_") and inspect.isfunction(fn):
            doc = inspect.getdoc(fn) or ""
            assert "first-result" in doc.lower(), f"{name} must say whether it is first-result"
            assert "return" in doc.lower() or "Returns" in doc, f"{name} must say what it returns"


def test_docs_link_to_files_that_exist():
    for page in DOCS.rglob("*.md"):
        for target in re.findall(r"\]\(([^)#:]+\.md)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


def _the_loop(path: Path) -> str:
    text = path.read_text()
    block = re.search(r"<!-- the loop:.*?-->\n```python\n(.*?)```\n<!-- end of the loop -->", text, re.S)
    assert block, f"{path.name} lost its loop block"
    return block.group(1)


def test_the_documented_loop_is_the_same_in_readme_and_trainer_md_and_runs(tmp_path, monkeypatch, capsys):
    import torch
    from torch.utils.data import TensorDataset

    code = _the_loop(DOCS / "trainer.md")
    assert _the_loop(DOCS.parent / "README.md") == code
    g = torch.Generator().manual_seed(0)
    x = torch.randn(160, 8, generator=g)
    labels = (x[:, 0] > 0).long()
    namespace = {
        "MyNet": lambda: torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)),
        "train_set": TensorDataset(x[:128], labels[:128]),
        "val_set": TensorDataset(x[128:], labels[128:]),
    }
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/trainer.md", "exec"), namespace)
    trainer = namespace["trainer"]
    trainer.close()  # flush TensorBoard while the working folder is still tmp_path (its writer thread is async)
    assert trainer.global_step == 10  # 10 epochs x 2 micro-batches of 64 / 2 per step
    assert (tmp_path / "runs" / "classifier" / "epoch9.pt").is_file()
    assert re.search(r"^steps +10$", capsys.readouterr().out, re.M)  # print(trainer.summary()): a table
