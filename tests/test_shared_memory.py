"""The shared-memory check at the start of a multiprocess-sampling worker, against real filesystems."""

from __future__ import annotations

import os

import pytest

from components.errors import GnnflowError
from components.gnn.shared_memory import CHANNEL_BYTES, check_sampling_memory


def _free_bytes(path: str) -> int:
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


def test_partitions_that_fit_pass(tmp_path):
    check_sampling_memory(1024, loaders=3, local_world_size=2, shm_path=str(tmp_path), sysv_table=str(tmp_path / "none"))


def test_partitions_larger_than_the_free_shared_memory_are_refused_with_the_size_to_ask_for(tmp_path):
    free = _free_bytes(str(tmp_path))
    with pytest.raises(GnnflowError) as error:
        check_sampling_memory(free // 2 + 2**30, loaders=3, local_world_size=2, shm_path=str(tmp_path), sysv_table=str(tmp_path / "none"))
    message = str(error.value)
    assert f"{tmp_path} has {free / 2**20:.0f} MiB free" in message
    assert "2 worker(s) on this machine share about" in message
    needed_gib = -(-int((free // 2 + 2**30) * 2 * 1.5) // 2**30)
    assert f"--shm-size={needed_gib}g" in message and "training.sampling: collocated" in message


def test_channels_beyond_the_system_v_limit_are_refused(tmp_path):
    table = tmp_path / "kernel"
    table.mkdir()
    pages = (2 * CHANNEL_BYTES) // os.sysconf("SC_PAGE_SIZE")  # room for two channels
    (table / "shmall").write_text(f"{pages}\n")
    check_sampling_memory(1024, loaders=2, local_world_size=1, shm_path=str(tmp_path), sysv_table=str(table))
    with pytest.raises(GnnflowError, match=r"kernel.shmall\) allows 512 MiB, but 2 worker\(s\) x 3 loader\(s\)"):
        check_sampling_memory(1024, loaders=3, local_world_size=2, shm_path=str(tmp_path), sysv_table=str(table))


def test_this_machines_real_limits_are_read():
    """/dev/shm and kernel.shmall of this machine: a tiny partition fits, an absurd one does not."""
    check_sampling_memory(1024, loaders=1, local_world_size=1)
    with pytest.raises(GnnflowError, match="/dev/shm has"):
        check_sampling_memory(2**50, loaders=1, local_world_size=1)
