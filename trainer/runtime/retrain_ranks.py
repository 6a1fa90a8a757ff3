"""The process group of a re-training whose run was trained by several data-parallel processes.

`process_group` makes the calling process rank 0 of a group of `ranks` on this machine and starts
the others (`python -m asearcher.trainer.runtime.retrain_ranks CONFIG MODEL_DIR`), each of which
runs `follow_retraining` until rank 0 releases it: the same environment DeepSpeed's launcher
gives a trainer's ranks (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT), so the gradients are
averaged over as many ranks, in the same way, as when the run trained.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgspec

from asearcher.streams.cluster.local_broker import free_port
from asearcher.trainer.runtime.config import TrainerConfig

RELEASE_S = 60.0  # how long the other ranks may take to leave once rank 0 has released them


@contextmanager
def process_group(ranks: int, config: TrainerConfig, model_dir: Path, work: Path) -> Iterator[None]:
    """Inside: this process is rank 0 of `ranks` (nothing changes for one). On leaving, the
    others are waited for (rank 0 must have released them) and killed if they linger; on an
    error they are killed at once, since they would wait for rank 0's next broadcast."""
    if ranks <= 1:
        yield
        return
    work.mkdir(parents=True, exist_ok=True)
    config_file = work / "retrain-trainer.json"
    config_file.write_bytes(msgspec.json.encode(config))
    world = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(ranks)}
    command = [sys.executable, "-m", __name__, str(config_file), str(model_dir)]
    others = [
        subprocess.Popen(command, env={**os.environ, **world, "RANK": str(r), "LOCAL_RANK": str(r)})
        for r in range(1, ranks)
    ]
    os.environ.update(world, RANK="0", LOCAL_RANK="0")
    try:
        yield
    except BaseException:
        _stop(others, 0.0)
        raise
    _stop(others, RELEASE_S)


def _stop(others: list[subprocess.Popen[bytes]], grace_s: float) -> None:
    for other in others:
        try:
            other.wait(grace_s)
        except subprocess.TimeoutExpired:
            other.kill()
            other.wait()


def main(config_file: str, model_dir: str) -> None:
    """A rank > 0: follow rank 0's builds and batches until it releases this process."""
    from asearcher.trainer.runtime.retrain import follow_retraining

    config = msgspec.json.decode(Path(config_file).read_bytes(), type=TrainerConfig)
    follow_retraining(config, Path(model_dir))


if __name__ == "__main__":
    main(*sys.argv[1:])
