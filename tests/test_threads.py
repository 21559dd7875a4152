"""The thread policy (components/runtime/threads.py): how a replica's cores are split."""

from __future__ import annotations

import os

import pytest
from pydantic import ValidationError

from components.config.resources import ThreadsSpec
from components.runtime.launcher import launch
from components.runtime.threads import OPENMP_WAIT_POLICY, openmp_wait_policy, plan_threads, replica_cores


def test_a_16_vcpu_replica_gives_each_trainer_its_share():
    # Two trainers sampling in process: 8 cores each, one left for the RPC thread that serves peers.
    plan = plan_threads(16, 2, "collocated")
    assert (plan.compute, plan.sampling_workers, plan.faiss, plan.readers) == (7, 0, 8, 8)
    # Multiprocess sampling: a third of the share samples (one thread a subprocess), the rest computes.
    plan = plan_threads(16, 2, "multiprocess")
    assert (plan.compute, plan.sampling_workers) == (6, 2)
    # Small shares keep no core for the RPC thread: eight trainers on 16 vCPUs compute with 2 threads each.
    assert plan_threads(16, 8, "collocated").compute == 2
    # Inference and full-graph training: the whole share computes.
    assert plan_threads(16, 4, "compute").compute == 4


def test_two_cores_keep_one_thread_per_trainer():
    # This project's test machine: two trainers, one core each, never oversubscribed.
    assert plan_threads(2, 2, "collocated").compute == 1
    assert (plan_threads(2, 2, "multiprocess").compute, plan_threads(2, 2, "multiprocess").sampling_workers) == (1, 1)
    assert plan_threads(1, 4, "compute").compute == 1  # more workers than cores: one thread each, not zero


def test_given_counts_win():
    plan = plan_threads(16, 2, "multiprocess", compute=3, sampling_workers=5, faiss=2, readers=1)
    assert (plan.compute, plan.sampling_workers, plan.faiss, plan.readers) == (3, 5, 2, 1)
    assert "16 core(s) for 2 local worker(s): 3 compute thread(s), 5 sampling subprocess(es)" in plan.describe()


@pytest.mark.parametrize(
    ("cpu_max", "cap"), [("200000 100000\n", 2), ("150000 100000\n", 2), ("50000 100000\n", 1), ("max 100000\n", None)]
)
def test_a_cgroup_quota_caps_the_cores(tmp_path, cpu_max, cap):
    path = tmp_path / "cpu.max"
    path.write_text(cpu_max)
    affinity = len(os.sched_getaffinity(0))
    assert replica_cores(path) == (min(affinity, cap) if cap else affinity)
    assert replica_cores(tmp_path / "missing") == affinity


def test_counts_below_one_are_refused():
    with pytest.raises(ValidationError, match="compute"):
        ThreadsSpec(compute=0)


def test_openmp_threads_sleep_when_idle_unless_the_environment_says_otherwise():
    assert openmp_wait_policy(environ := {}) == "PASSIVE" and environ == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert openmp_wait_policy(environ := {"OMP_WAIT_POLICY": "ACTIVE"}) == "ACTIVE" and environ == {"OMP_WAIT_POLICY": "ACTIVE"}


def _wait_policy(ctx) -> str | None:  # noqa: ARG001
    return os.environ.get("OMP_WAIT_POLICY")


def test_launched_workers_get_the_wait_policy():
    expected = os.environ.get("OMP_WAIT_POLICY", OPENMP_WAIT_POLICY)  # a value set before the first launch stays
    assert launch(_wait_policy, world_size=2) == [expected, expected]
