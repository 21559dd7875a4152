"""``resources.reuse_freed_memory``: after ``reuse_freed_memory`` a process keeps the pages of a
large block it frees (the next block reuses them), and its children inherit the setting; without
it glibc hands them back at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROBE = """
import json, os, sys
import numpy as np
from components.runtime.allocator import reuse_freed_memory

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

reused = reuse_freed_memory() if sys.argv[1] == "reuse" else None
before = rss()
block = np.ones(256 << 17)  # 256 MiB of float64 ones, touched
held = rss()
del block
print(json.dumps({"reused": reused, "grew": held - before, "kept": rss() - before,
                  "child_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}}))
"""


def probe(mode: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, env=env, check=True, timeout=120)
    return json.loads(done.stdout)


def test_freed_blocks_stay_in_the_process_only_when_asked():
    plain, reused = probe("plain"), probe("reuse")
    mib = 1 << 20
    assert plain["grew"] > 250 * mib and reused["grew"] > 250 * mib
    assert plain["kept"] < 16 * mib  # glibc unmapped the block
    assert reused["reused"] is True and reused["kept"] > 250 * mib  # its pages stayed
    assert plain["child_env"] == {}
    assert reused["child_env"] == {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(2**31 - 1)}
