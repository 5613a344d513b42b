"""The DCGAN example's image cache under faults: a full disk, a killed build, jobs sharing one cache.

Each fault must end in one clear line (or not at all), leave no temporary file and no process behind, and
never take away a cache another job is reading. A full disk is a real 2 MB tmpfs where this runs as root
(the test is skipped elsewhere) and a patched writer everywhere.
"""

from __future__ import annotations

import errno
import os
import pickle
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from paths import REPO
from PIL import Image
from torch.utils.data import DataLoader

import devplug

from dcgan.cache import prepare_cache, writer  # examples/dcgan/cache/

#: The import path of the scripts run in a child process: devplug and the example's package dcgan.
CHILD_PYTHONPATH = os.pathsep.join([str(REPO), str(REPO / "examples")])


def write_jpegs(folder: Path, count: int, size: tuple[int, int] = (48, 36)) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = []
    for index in range(count):
        paths.append(folder / f"img{index:04d}.jpg")
        Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(paths[-1], quality=80)
    return paths


def live_processes(*, session: int | None = None, parent: int | None = None) -> list[int]:
    """Processes (not zombies) in ``session``, or children of ``parent``, from /proc."""
    if not Path("/proc/self/stat").exists():
        pytest.skip("needs /proc (Linux)")
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        state, ppid, _group, sid = stat[stat.rindex(")") + 2:].split()[:4]
        if state != "Z" and (int(sid) == session or int(ppid) == parent):
            found.append(int(entry))
    return found


def wait_until_gone(session: int, seconds: float) -> list[int]:
    """Wait up to ``seconds`` for every process of ``session`` to exit; kill and return those still there."""
    deadline = time.monotonic() + seconds
    while (left := live_processes(session=session)) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:  # only processes of the session this test started
        os.kill(pid, signal.SIGKILL)
    return left


def leftovers(directory: Path) -> list[str]:
    """Files in ``directory`` other than empty build-lock files."""
    return sorted(p.name for p in directory.iterdir() if not (p.name.endswith(".lock") and p.stat().st_size == 0))


def run_script(code: str, *args: str, timeout: float = 60) -> tuple[subprocess.CompletedProcess, list[int]]:
    """Run ``code`` (Python) in its own session; the result and the session's processes still alive after it."""
    process = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True, env={**os.environ, "PYTHONPATH": CHILD_PYTHONPATH})
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:  # e.g. a stranded worker keeps the output pipe open
        left = wait_until_gone(process.pid, 0)
        pytest.fail(f"no result after {timeout} s; processes left behind: {left}")
    left = wait_until_gone(process.pid, 5.0)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err), left


#: Runs the example's main(argv); with "nocheck" first, the free-space check is skipped, so the disk fills
#: while the cache is written.
RUN_EXAMPLE = """
import sys
import dcgan.cache.prepare as prepare
args = sys.argv[1:]
if args[0] == "nocheck":
    args = args[1:]
    prepare._check_space = lambda *a: None
from dcgan import train
sys.exit(train.main(args))
"""


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MB tmpfs (root only; skipped where it cannot be mounted)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if shutil.which("mount") is None or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
                                                        capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def one_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dcgan: error: "), result.stderr
    return lines[0]


# ---- a full disk ------------------------------------------------------------------------------------


def test_full_disk_is_refused_before_the_build_with_the_need_and_the_free_space(tmp_path, small_disk):
    write_jpegs(tmp_path / "images", 300)  # 300 x 3 x 64 x 64 bytes = 3.7 MB, on a 2 MB disk
    result, left = run_script(RUN_EXAMPLE, "--data", str(tmp_path / "images"), "--image-size", "64", "--cache-only",
                              "--workers", "2", "--cache-dir", str(small_disk))
    line = one_error_line(result)
    assert "needs 3.7 MB" in line and "MB free" in line and "--cache-dir" in line, line
    assert left == [] and leftovers(small_disk) == []


def test_disk_filling_during_the_build_is_one_line_and_leaves_nothing(tmp_path, small_disk):
    write_jpegs(tmp_path / "images", 300)
    result, left = run_script(RUN_EXAMPLE, "nocheck", "--data", str(tmp_path / "images"), "--image-size", "64",
                              "--cache-only", "--workers", "2", "--cache-dir", str(small_disk))
    line = one_error_line(result)
    assert "disk filled up" in line and "--cache-dir" in line, line
    assert left == [] and leftovers(small_disk) == []
    # The disk is usable again: a smaller cache fits and is built.
    write_jpegs(tmp_path / "few", 20)
    dataset, report = prepare_cache(tmp_path / "few", 64, small_disk, workers=0)
    assert report.built and len(dataset) == 20 and not [name for name in leftovers(small_disk) if ".tmp" in name]
    dataset.close()


def test_a_write_error_during_the_build_stops_the_workers_and_removes_the_file(tmp_path, monkeypatch):
    write_jpegs(tmp_path / "images", 200)
    writes = []
    real_pwrite = os.pwrite

    def filling_pwrite(fd, data, offset):  # the disk fills after a few rows
        writes.append(offset)
        if len(writes) > 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(writer.os, "pwrite", filling_pwrite)
    # children this process already had (another test's fork server, say) are not the build's
    before = set(live_processes(parent=os.getpid()))
    with pytest.raises(devplug.DataError, match=r"disk filled up while writing the image cache .*--cache-dir"):
        prepare_cache(tmp_path / "images", 32, tmp_path / "cache", workers=2)
    assert leftovers(tmp_path / "cache") == []
    assert set(live_processes(parent=os.getpid())) - before == set()  # the decode workers were shut down


def test_too_little_space_names_the_need_the_free_space_and_cache_dir(tmp_path, monkeypatch):
    write_jpegs(tmp_path / "images", 10)
    monkeypatch.setattr(writer.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9, 5000))
    with pytest.raises(devplug.DataError) as info:
        prepare_cache(tmp_path / "images", 16, tmp_path / "cache", workers=0)
    message = str(info.value)
    assert "needs 7.8 kB (10 images x 3 x 16 x 16 bytes)" in message and "5.0 kB free" in message
    assert "--cache-dir" in message and leftovers(tmp_path / "cache") == []


# ---- a killed build ---------------------------------------------------------------------------------

#: Builds a cache with slowed decoding in 2 workers (so it is still running when the test kills it).
SLOW_BUILD = """
import sys, time
import dcgan.cache.decode_pool as pool
from dcgan.cache import prepare_cache
original = pool.load_rgb
pool.load_rgb = lambda *a, **k: (time.sleep(0.01), original(*a, **k))[1]
prepare_cache(sys.argv[1], 64, sys.argv[2], workers=2)
"""


@pytest.mark.slow
def test_sigkill_during_a_build_leaves_no_process_and_the_next_build_cleans_up(tmp_path):
    write_jpegs(tmp_path / "images", 400)
    cache = tmp_path / "cache"
    process = subprocess.Popen([sys.executable, "-c", SLOW_BUILD, str(tmp_path / "images"), str(cache)],
                               start_new_session=True, env={**os.environ, "PYTHONPATH": CHILD_PYTHONPATH})
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (
                len(live_processes(session=process.pid)) >= 3 and list(cache.glob(".*.tmp*"))):
            time.sleep(0.05)
        time.sleep(1.0)  # the workers are mid-way: results queued for a parent that is about to vanish
        assert process.poll() is None, "the build ended before it could be killed"
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
    finally:
        left = wait_until_gone(process.pid, 5.0)
    assert left == [], "decode workers outlived the killed build"
    dataset, report = prepare_cache(tmp_path / "images", 64, cache, workers=0)
    assert report.built and len(dataset) == 400
    assert not list(cache.glob(".*.tmp*"))  # the killed build's temporary file was collected


# ---- jobs sharing a cache ---------------------------------------------------------------------------


def test_a_rebuild_never_removes_the_cache_a_running_job_reads(tmp_path):
    paths = write_jpegs(tmp_path / "images", 8)
    cache = tmp_path / "cache"
    first, report = prepare_cache(tmp_path / "images", 16, cache, workers=0)
    loader = DataLoader(first, batch_size=4, num_workers=1, persistent_workers=False)  # workers map it each epoch
    epoch_one = torch.cat([images for images, _ in loader])

    os.utime(paths[0], ns=(1_000_000_000, 1_000_000_000))  # another job sees a changed folder and rebuilds
    second, rebuilt = prepare_cache(tmp_path / "images", 16, cache, workers=0)
    assert rebuilt.built and rebuilt.path != report.path
    assert report.path.exists()  # still in use by the first job

    epoch_two = torch.cat([images for images, _ in loader])  # a new worker opens the old version again
    assert torch.equal(epoch_one, epoch_two)

    first.close()  # the first job ends; the next job to look collects the stale version
    prepare_cache(tmp_path / "images", 16, cache, workers=0)
    assert sorted(p.name for p in cache.glob("*.npy")) == [rebuilt.path.name]
    second.close()


def test_two_jobs_building_one_cache_at_once_decode_it_once(tmp_path):
    write_jpegs(tmp_path / "images", 30)
    start = threading.Barrier(2)
    results, waited = [], []

    def job() -> None:
        start.wait()
        results.append(prepare_cache(tmp_path / "images", 16, tmp_path / "cache", workers=0, on_wait=waited.append))

    threads = [threading.Thread(target=job) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    reports = [report for _dataset, report in results]
    assert sorted(r.built for r in reports) == [False, True] and sum(r.opened for r in reports) == 30
    assert len(waited) <= 1 and len(list((tmp_path / "cache").glob("*.npy"))) == 1
    first, second = (dataset for dataset, _ in results)
    assert all(torch.equal(first[i][0], second[i][0]) for i in range(30))


def test_a_dead_builders_temporary_file_is_removed_by_the_next_build(tmp_path):
    paths = write_jpegs(tmp_path / "images", 6)
    cache = tmp_path / "cache"
    dataset, report = prepare_cache(tmp_path / "images", 16, cache, workers=0)
    dataset.close()
    stale = cache / f".{report.path.stem}.999999.tmp.npy"
    stale.write_bytes(b"\0" * 4096)  # what a build killed with SIGKILL leaves
    os.utime(paths[0], ns=(1_000_000_000, 1_000_000_000))
    _dataset, rebuilt = prepare_cache(tmp_path / "images", 16, cache, workers=0)
    assert rebuilt.built and not stale.exists()
    assert "images/s" in rebuilt.describe()


def test_the_cache_survives_being_opened_in_a_new_process(tmp_path):
    write_jpegs(tmp_path / "images", 4)
    dataset, _report = prepare_cache(tmp_path / "images", 16, tmp_path / "cache", workers=0)
    copy = pickle.loads(pickle.dumps(dataset))  # what a spawned loader worker receives: no lock, no map
    assert copy.lock is None and torch.equal(copy[3][0], dataset[3][0])


def test_a_job_that_finds_the_cache_being_built_waits_for_it_on_a_disk_with_room_for_one(tmp_path, monkeypatch):
    write_jpegs(tmp_path / "images", 20)
    cache = tmp_path / "cache"
    need = len(writer.npy_header((20, 3, 16, 16))) + 20 * 3 * 16 * 16
    real_usage = shutil.disk_usage

    def disk_with_room_for_one(path):  # a disk of 1.5 caches: what the cache folder holds is used
        used = sum(p.stat().st_size for p in cache.iterdir() if p.is_file())
        total = real_usage(path).total
        return shutil._ntuple_diskusage(total, total - need * 3 // 2 + used, need * 3 // 2 - used)

    monkeypatch.setattr(writer.shutil, "disk_usage", disk_with_room_for_one)
    building, release = threading.Event(), threading.Event()

    def slow_progress(done: int, total: int) -> None:  # the first job holds its half-written file here
        building.set()
        assert release.wait(timeout=30)

    first: list = []
    thread = threading.Thread(target=lambda: first.append(
        prepare_cache(tmp_path / "images", 16, cache, workers=0, progress=slow_progress)))
    thread.start()
    assert building.wait(timeout=30)
    try:
        dataset, report = prepare_cache(tmp_path / "images", 16, cache, workers=0,
                                        on_wait=lambda path: release.set())
    finally:
        release.set()
        thread.join(timeout=60)
    assert first and first[0][1].built and not report.built and len(dataset) == 20
    dataset.close()
    first[0][0].close()


# ---- what a cache was decoded with ---------------------------------------------------------------------


def test_a_cache_decoded_by_another_pillow_is_rebuilt_not_reused(tmp_path, monkeypatch):
    """The cached pixels are what Pillow decoded: a cache built under another Pillow (another JPEG decoder,
    other resampling) would train on other pixels than the folder's own loader reads."""
    import PIL

    write_jpegs(tmp_path / "images", 4)
    dataset, report = prepare_cache(tmp_path / "images", 16, tmp_path / "cache", workers=0)
    dataset.close()
    assert report.built
    monkeypatch.setattr(PIL, "__version__", "0.0.1")
    dataset, again = prepare_cache(tmp_path / "images", 16, tmp_path / "cache", workers=0)
    dataset.close()
    assert again.built and again.path != report.path


def test_a_cache_decoded_by_other_decoding_code_is_rebuilt_not_reused(tmp_path, monkeypatch):
    """A change to how devplug decodes images (16-bit TIFFs scaled differently, say) makes a new cache: the old
    one holds the old decoder's pixels."""
    import dcgan.cache.decode_pool as decode_pool

    write_jpegs(tmp_path / "images", 4)
    dataset, report = prepare_cache(tmp_path / "images", 16, tmp_path / "cache", workers=0)
    dataset.close()
    changed = tmp_path / "decode_pool.py"
    changed.write_bytes(Path(decode_pool.__file__).read_bytes() + b"\n# decoded differently\n")
    monkeypatch.setattr(decode_pool, "__file__", str(changed))
    dataset, again = prepare_cache(tmp_path / "images", 16, tmp_path / "cache", workers=0)
    dataset.close()
    assert again.built and again.path != report.path
