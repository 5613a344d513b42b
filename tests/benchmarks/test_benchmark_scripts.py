"""Benchmark scripts run end to end at tiny sizes (their figures are not checked: no timed assertions)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
from paths import REPO

BENCHMARKS = REPO / "benchmarks"


def bench_env() -> dict[str, str]:
    """The environment of a benchmark process: this checkout's devplug first."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def run_script(*argv: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=bench_env(), cwd=BENCHMARKS,
                          timeout=timeout, check=False)


@pytest.mark.slow
def test_cpu_levers_prints_each_workloads_table_with_warm_up_and_compute_fraction():
    proc = run_script("cpu_levers.py", "--batch-size", "4", "--mlp-batch-size", "4", "--rounds", "2",
                      "--block-seconds", "0.01", "--warmup-steps", "2", "--variants", "channels_last,compile",
                      "--model", "tiny-32")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert re.search(r"peak [\d.]+ GFLOP/s \((computed|measured \(cached\))", out), out
    assert "DCGAN D+G step, tiny-32, batch 4" in out and "MLP 64-128-10 step, batch 4" in out
    rows = {m[1].strip(): m for m in re.finditer(
        r"^(eager \(A/A\)|eager|channels_last|compile)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x\s+([\d.e+-]+)\s+"
        r"([\d.e+-]+)%\s+(-?[\d.]+)\s+([\d.]+)\s+(.*)$", out, re.MULTILINE)}
    # dcgan: eager, A/A, channels_last, compile; mlp: eager, A/A, compile (no channels_last without 4-D tensors)
    assert len(re.findall(r"^(eager|eager \(A/A\)|channels_last|compile)\s", out, re.MULTILINE)) == 7, out
    assert {"eager", "eager (A/A)", "channels_last", "compile"} <= set(rows), out
    assert float(rows["compile"][7]) > 0  # compilation shows up as warm-up, outside the steady-state time
    assert re.search(r"^dcgan: channels_last [\d.]+x eager -> (pays|costs|within noise)$", out, re.MULTILINE), out
    assert re.search(r"^mlp: compile [\d.]+x eager -> (pays|costs|within noise)$", out, re.MULTILINE), out
    assert "mlp: channels_last" not in out
    assert out.count("A/A floor:") == 2 and "losses finite: True" in out


def test_cpu_levers_rejects_an_unknown_variant_in_one_line():
    proc = run_script("cpu_levers.py", "--variants", "eager,turbo")
    assert proc.returncode == 2 and "unknown variant 'turbo'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_reference_train_prints_when_its_first_step_ended(tmp_path):
    from PIL import Image

    folder = tmp_path / "images" / "photos"
    folder.mkdir(parents=True)
    for index in range(4):
        Image.new("RGB", (20, 20), (index * 60, 0, 0)).save(folder / f"{index}.png")
    launched = time.time()
    proc = run_script("reference_dcgan.py", "train", "--dataroot", str(tmp_path / "images"), "--epochs", "1",
                      "--batch-size", "2", "--workers", "0", "--image-size", "16", "--nz", "4", "--ngf", "4",
                      "--ndf", "4", "--print-every", "100")
    ended = time.time()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    match = re.search(r"^reference first step: done at Unix time ([\d.]+)", proc.stdout, re.MULTILINE)
    assert match, proc.stdout
    assert launched < float(match[1]) < ended


def reference_variant(tmp_path, start: str):
    """A `reference_dcgan.Variant` whose process runs ``start`` (which sets ``t``, the first step's end) and then
    prints what the reference prints."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import reference_dcgan
    finally:
        sys.path.remove(str(BENCHMARKS))
    child = (start + "print('reference: device cpu, fake')\n"
             "print('reference: 4 images in 0.3 s = 13.3 images/s (training loop)')\n"
             "print('reference steady state: 2 images in 0.2 s = 10.0 images/s')\n"
             "print(f'reference first step: done at Unix time {t:.6f} (time.time())')\n")
    return reference_dcgan.Variant("reference", lambda _out: [sys.executable, "-c", child], tmp_path, bench_env(), 0,
                                   reference_dcgan.parse_reference)


def test_reference_compare_derives_each_process_s_time_to_its_first_step(tmp_path):
    variant = reference_variant(tmp_path, "import time; time.sleep(0.3); t = time.time(); time.sleep(0.3)\n")
    start = time.perf_counter()
    variant.run()
    wall = time.perf_counter() - start
    variant.after()
    first = variant.results[0]["first_step_s"]
    assert 0.3 <= first < wall - 0.25, (first, wall)  # after the first sleep, before the second one ended


def test_reference_compare_floor_process_imports_torch_and_takes_one_optimizer_step(tmp_path):
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import reference_dcgan
    finally:
        sys.path.remove(str(BENCHMARKS))
    floor = reference_dcgan.Variant("floor", lambda _out: [sys.executable, "-c", reference_dcgan.FLOOR_PROGRAM],
                                    tmp_path, bench_env(), 0, reference_dcgan.parse_floor)
    floor.run()
    floor.after()
    result = floor.results[0]
    assert result["images"] == 0 and result["first_step_s"] > 0, result
    assert "torch.optim.Adam([p]).step()" in reference_dcgan.FLOOR_PROGRAM


def test_reference_compare_counts_each_process_s_cpu_seconds(tmp_path):
    # the CPU table: what the process and its children ran, not the time it spent waiting (a loaded machine)
    variant = reference_variant(tmp_path, "import time; t = time.time(); time.sleep(0.4)\n"
                                          "end = time.process_time() + 0.3\n"
                                          "while time.process_time() < end: pass\n")
    variant.run()
    variant.after()
    cpu = variant.results[0]["cpu_s"]
    assert 0.3 <= cpu < 0.3 + 5.0, cpu  # the busy loop and the interpreter's start, not the sleep's wait


def test_import_cost_children_read_cached_bytecode_and_this_checkout(monkeypatch):
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import import_cost
    finally:
        sys.path.remove(str(BENCHMARKS))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")  # set here, devplug would be compiled from source every time
    monkeypatch.setenv("PYTHONPATH", "elsewhere")
    env = import_cost.child_environment()
    assert "PYTHONDONTWRITEBYTECODE" not in env
    assert env["PYTHONPATH"].split(os.pathsep) == [str(import_cost.REPO), "elsewhere"]
    wall, cpu = import_cost.measure("sum(range(10))")  # timed after torch: a statement this small costs ~nothing
    assert 0 <= wall < 0.5 and 0 <= cpu < 0.5


def test_import_cost_rejects_no_rounds_in_one_line():
    proc = run_script("import_cost.py", "--rounds", "0")
    assert proc.returncode == 2 and "--rounds must be at least 1" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_mfu_prints_one_table_with_both_views_for_each_step_and_precision():
    proc = run_script("mfu.py", "--batch-size", "4", "--lm-batch", "2", "--lm-width", "16", "--lm-layers", "1",
                      "--lm-heads", "2", "--lm-context", "8", "--gemm-size", "128", "--rounds", "2",
                      "--block-seconds", "0.02")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert re.search(r"^MFU two ways on cpu: .+ 2 interleaved rounds", out, re.MULTILINE), out
    rows = re.findall(r"^(32-true|bf16-mixed)\s+(DCGAN tiny-32, batch 4|LM 16x1, ctx 8, batch 2)\s+([\d.]+)\s+"
                      r"([\d.]+ [MGT]?FLOP/s)\s+([\d.]+ [GT]FLOP/s)\s+(computed|measured \(cached\))\s+([\d.]+)%\s+"
                      r"([\d.]+ [MGT]?FLOP/s)\s+([\d.]+)%$", out, re.MULTILINE)
    assert {(r[0], r[1].split()[0]) for r in rows} == {(p, w) for p in ("32-true", "bf16-mixed")
                                                      for w in ("DCGAN", "LM")}, out
    assert re.search(r"^peak: [\d.]+ GFLOP/s fp32, computed: \d+ cores × [\d.]+ GHz", out, re.MULTILINE) or \
        "measured (cached)" in out, out
    assert re.search(r"^peak: [\d.]+ [GT]FLOP/s bf16, ", out, re.MULTILINE), out


def test_mfu_rejects_an_unknown_workload_in_one_line():
    proc = run_script("mfu.py", "--workloads", "dcgan,resnet")
    assert proc.returncode == 2 and "unknown workload 'resnet'" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.slow)])  # compiling: 20-30 s
def test_fp8_layers_times_profiles_and_counts_compiles_tiny_and_emulated_on_the_cpu(compiled):
    pytest.importorskip("torchao")
    proc = run_script("fp8_layers.py", "--device", "cpu", "--emulate", "--tokens", "64", "--width", "32",
                      "--rounds", "2", "--iters", "1", "--warmup", "1", "--shapes", "square", "--recipes", "tensorwise",
                      "--top", "5", "--host-layers", "2", "--compile" if compiled else "--no-compile")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "emulated fp8; bf16 autocast, fp32 weights; tokens 64, width 32" in out
    assert "square: Linear(32, 32) on 64 tokens, forward+backward, 2 rounds x 1 passes" in out
    eager = ["bf16 eager", "bf16 eager (A/A)", "fp8 tensorwise eager", "fp8 tensorwise+gather eager"]
    rows = re.findall(r"^(bf16 eager|bf16 eager \(A/A\)|fp8 tensorwise eager|fp8 tensorwise\+gather eager|"
                      r"bf16 compiled|fp8 tensorwise compiled)\s+[\d.]+\s+[\d.e+-]+\s+[\d.]+$", out, re.MULTILINE)
    assert rows == eager + (["bf16 compiled", "fp8 tensorwise compiled"] if compiled else []), out
    assert re.search(r"^A/A floor: bf16 eager \(A/A\)/bf16 eager per round [\d.]+-[\d.]+ -> floor [\d.]+%$", out,
                     re.MULTILINE), out
    verdicts = re.findall(r"^square: (fp8 [\w+]+ \w+) [\d.]+x the time of (bf16 \w+) -> (faster|slower|within noise)$",
                          out, re.MULTILINE)
    assert [(v, against) for v, against, _ in verdicts] == [
        ("fp8 tensorwise eager", "bf16 eager"), ("fp8 tensorwise+gather eager", "bf16 eager"),
        *([("fp8 tensorwise compiled", "bf16 compiled")] if compiled else [])], out
    counts = re.findall(r"^square: (bf16 compiled|fp8 tensorwise compiled): graph breaks (\d+), recompiles after the "
                        r"first call (\d+), frames (\d+), graphs (\d+); break reasons: ", out, re.MULTILINE)
    assert [name for name, *_ in counts] == (["bf16 compiled", "fp8 tensorwise compiled"] if compiled else []), out
    if compiled:
        assert counts[0][1:3] == ("0", "0")  # plain bf16 layers compile in one graph, once
    profile = out.split("profile: fp8 tensorwise eager, square, one forward+backward on 64 tokens: top 5 CPU ops", 1)
    assert len(profile) == 2 and "Self CPU time total" in profile[1], out
    assert len(re.findall(r"^\s+(aten::|matmul_with_hp_or_float8|PythonSubclass|_ToFloat8)", profile[1],
                          re.MULTILINE)) >= 3, profile[1]
    # the tiny LM network's host cost: fp8 runs more operators than bf16, through torchao's tensor subclass
    assert "host: the LM network, 2 layers at width 64, context 32, batch 2" in out, out
    host_rows = re.findall(r"^(bf16 eager|bf16 eager \(A/A\)|fp8 tensorwise eager)\s+[\d.]+\s+[\d.]+\s+"
                           r"([\d,]+)\s+([\d,]+)$", out.split("host: the LM network", 1)[1], re.MULTILINE)
    host = {name: counts for name, *counts in host_rows}
    ops = {name: tuple(int(n.replace(",", "")) for n in counts) for name, counts in host.items()}
    assert ops["bf16 eager"] == ops["bf16 eager (A/A)"] and ops["bf16 eager"][1] == 0, out
    assert ops["fp8 tensorwise eager"][0] > 2 * ops["bf16 eager"][0] and ops["fp8 tensorwise eager"][1] > 0, out


def test_fp8_layers_without_the_hardware_says_so_in_one_line():
    proc = run_script("fp8_layers.py", "--device", "cpu")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == "fp8_layers: error: cpu has no fp8 matrix units: pass --emulate to run torchao's " \
                                  "emulation"


def test_image_logging_prints_plain_devplug_and_the_a_a_with_the_png_sizes():
    pytest.importorskip("google_crc32c")
    proc = run_script("image_logging.py", "--rounds", "1", "--content", "smooth")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert re.search(r"^one 8x8 grid of 64x64 smooth images to a PNG file and TensorBoard \(.+; PNG [\d,]+ KB plain, "
                     r"[\d,]+ KB devplug; devplug's checksums in C\)$", out, re.MULTILINE), out
    rows = re.findall(r"^(plain|devplug|devplug \(A/A\))\s+([\d.]+)\s+([\d.]+)x$", out, re.MULTILINE)
    assert [r[0] for r in rows] == ["plain", "devplug", "devplug (A/A)"] and rows[0][2] == "1.00", out
