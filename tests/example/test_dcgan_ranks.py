"""The DCGAN example's image cache on several processes (one rank that cannot build or open it stops them
all), and the processes that build it."""

from __future__ import annotations

import fcntl

import pytest
from dcgan_runs import TINY, write_images
from dist_scripts.common import run_ranks
from paths import REPO

import devplug
from devplug.toolkit import available_cpus

from dcgan import cli
from dcgan.data import load_training_data

SCRIPT = REPO / "examples" / "dcgan.py"


@pytest.mark.slow
def test_a_cache_the_main_process_cannot_build_stops_every_rank_with_one_line(tmp_path):
    """Rank 0 builds the image cache while rank 1 waits; when the build fails, rank 1 is told and ends too
    (before, it waited at a barrier for the process group's ten minutes)."""
    folder = tmp_path / "bad"
    folder.mkdir()
    for name in ("a.jpg", "b.png", "c.jpeg"):
        (folder / name).write_bytes(b"garbage")
    results = run_ranks(SCRIPT, [*TINY, "--steps", "2", "--data", str(folder), "--cache-dir", str(tmp_path / "cache"),
                                 "--out", str(tmp_path / "out")], world_size=2, timeout=120, expect_code=2)
    main, other = (r.stderr.strip().splitlines() for r in results)
    assert len(main) == 1 and main[0].startswith("dcgan: error: ") and "none of the 3 images" in main[0], main
    assert len(other) == 1 and other[0].startswith("dcgan: error: ") and "main process" in other[0], other


class Ranks:
    """A Trainer's view of a two-process job, for the image cache's agreement between ranks (no process group)."""

    def __init__(self, *, main: bool, word: str | None = None, others_failed: int = 0) -> None:
        self.is_main_process, self.world_size = main, 2
        self.word, self.others_failed = word, others_failed
        self.calls: list[str] = []

    def broadcast(self, obj, src=0):
        self.calls.append(f"broadcast {obj!r}")
        return obj if self.is_main_process else self.word

    def all_reduce(self, value, op="sum"):
        self.calls.append(f"all_reduce {value!r} {op}")
        return max(value, self.others_failed)


def settings_for(tmp_path, folder):
    return cli.resolve(cli.parse([*TINY, "--data", str(folder), "--cache-dir", str(tmp_path / "cache"),
                                  "--out", str(tmp_path / "out")]))


def test_a_rank_that_cannot_open_the_cache_stops_the_main_process_too(tmp_path):
    """On several machines with a cache folder each, the main process builds and the others find nothing: the
    main process must not train on alone (its first step would wait for them), and the cache is released."""
    write_images(tmp_path / "images", 6)
    ranks = Ranks(main=True, others_failed=1)
    with pytest.raises(devplug.DataError, match=r"another process could not open the image cache.*--cache-dir"):
        load_training_data(settings_for(tmp_path, tmp_path / "images"), ranks)
    assert ranks.calls == ["broadcast None", "all_reduce 0 max"]
    (cache,) = (tmp_path / "cache").glob("*.npy")
    with open(cache, "rb") as handle:  # nobody holds it any more: a later rebuild may remove it
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_a_rank_hears_the_main_processs_error_and_opens_nothing(tmp_path):
    ranks = Ranks(main=False, word="none of the 3 images can be read")
    (tmp_path / "images").mkdir()  # beside --out: a run folder inside the data folder is refused
    with pytest.raises(devplug.DataError, match="main process could not prepare the image cache: none of the 3"):
        load_training_data(settings_for(tmp_path, tmp_path / "images"), ranks)
    assert ranks.calls == ["broadcast None"]
    assert not (tmp_path / "cache").exists()


def test_workers_caps_the_cache_build_at_the_cores_there_are(tmp_path):
    """``--workers`` "also caps the processes that build the cache (default: every CPU core)": a cap, so more
    workers than cores build with one process per core, not with as many decode processes as asked."""
    write_images(tmp_path / "images", 6)
    cores = available_cpus()
    settings = cli.resolve(cli.parse([*TINY, "--workers", str(cores + 1), "--data", str(tmp_path / "images"),
                                      "--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "out")]))
    data = load_training_data(settings, None)
    data.close()
    assert data.cache is not None and data.cache.built
    assert data.cache.workers == cores
