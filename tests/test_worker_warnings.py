"""A clean multi-process run prints no warning of torch's: GLT's sampling subprocesses, which start
RPC inside GLT's loop, write none to stderr. (The train and infer workers, which join gloo and
GLT's RPC, are held to the same in tests/test_pipeline_run.py: the clean rerun of
test_a_run_stopped_by_sigterm_in_train_exits_75_and_its_rerun_resumes_train_only.)

torch 2.3's own RPC start-up warns that it uses a ProcessGroupGloo backend as a process group
(components/runtime/rendezvous.py, RPC_BACKEND_WARNING); gnnflow silences that one message."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiworker

REPO = Path(__file__).resolve().parents[1]


# A GLT sampling subprocess unpickles its worker options, then starts RPC inside GLT's loop.
START_RPC = """
import os, pickle, sys
if sys.argv[1] == "unpickle":
    pickle.loads(sys.stdin.buffer.read())  # as a sampling subprocess gets its options
import torch.distributed.rpc as rpc
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
rpc.init_rpc("sampler", rank=0, world_size=1)
rpc.shutdown()
print("rpc ran")
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_sampling_subprocess_starts_rpc_without_the_warning() -> None:
    from multiprocessing.reduction import ForkingPickler

    from graphlearn_torch.distributed import MpDistSamplingWorkerOptions

    from components.gnn import glt_compat

    glt_compat.install()  # as a trainer does before it builds a multiprocess loader
    options = bytes(ForkingPickler.dumps(MpDistSamplingWorkerOptions(num_workers=1, master_addr="127.0.0.1", master_port=1)))
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    stderr = {}
    for mode in ("plain", "unpickle"):
        result = subprocess.run(
            [sys.executable, "-c", START_RPC, mode, str(_free_port())],
            input=options,
            cwd=REPO,
            env=environ,
            capture_output=True,
            timeout=300,
        )
        assert result.returncode == 0 and result.stdout == b"rpc ran\n", result.stderr
        stderr[mode] = result.stderr.decode()
    assert "ProcessGroupGloo" in stderr["plain"]  # torch's start-up warns where nothing silences it: this test sees it
    assert "UserWarning" not in stderr["unpickle"], stderr["unpickle"]
