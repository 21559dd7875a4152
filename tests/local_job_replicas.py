"""A local job of two stand-in replicas, for tests of what ``gnnflow local-job`` does on SIGTERM
without the cost of a step: ``python -m tests.local_job_replicas KIND GRACE_S``.

Each replica prints ``ready`` once its SIGTERM handling is in place, then waits. KIND says what
they do on SIGTERM: ``preempted`` (both exit 75, as train's replicas do), ``stubborn`` (the
second ignores it and must be killed after the grace); with ``alone`` the second exits 75 by
itself a moment after ``ready``, as a container that got Vertex AI's SIGTERM directly."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from components.runtime.entrypoint import run_cli
from pipelines.local_job.replicas import ProcessReplicas, Replica, run_replicas

_ON_SIGTERM = {
    "exit75": "signal.signal(signal.SIGTERM, lambda *_: sys.exit(75))",
    "ignore": "signal.signal(signal.SIGTERM, signal.SIG_IGN)",
}
_KINDS = {"preempted": ("exit75", "exit75"), "stubborn": ("exit75", "ignore"), "alone": ("exit75", "exit75")}


def _program(on_sigterm: str, then_exit_75: bool = False) -> str:
    wait = "time.sleep(0.5); sys.exit(75)" if then_exit_75 else "time.sleep(120)"
    return f"import signal, sys, time\n{_ON_SIGTERM[on_sigterm]}\nprint('ready', flush=True)\n{wait}\n"


def main(arguments: Sequence[str] | None) -> None:
    kind, grace_s = (arguments or [])[0], float((arguments or [])[1])
    replicas = [
        Replica(f"workerpool{index}", 0, "127.0.0.1:0", (sys.executable, "-c", _program(behaviour, kind == "alone" and index == 1)), {}, "")
        for index, behaviour in enumerate(_KINDS[kind])
    ]
    run_replicas(ProcessReplicas(), replicas, None, label="local-job stand-in", grace_s=grace_s)
    print("local-job stand-in: done", flush=True)


if __name__ == "__main__":
    sys.exit(run_cli(main))
