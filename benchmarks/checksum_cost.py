"""What checking every read against its manifest's CRC32C costs; prints markdown tables.

Files: --files partition-sized safetensors files of --mib MiB each (float32 feature tensors, as
a partition's node files hold), and as many TFRecord shards of node records of about the same
size, published by ``components.storage.staged_output`` into a local temp folder (so the manifest
holds their sizes and CRC32Cs). With --gcs, the same partition files also on a fake-gcs-server on
loopback (tests/gcs_emulator.py). Every figure is the best of --repeat rounds, all variants in
each round, page cache warm (a cold read from disk or the network only dilutes the check).

Measured, seconds per GiB read and the ratio to the same read unchecked:
- google_crc32c alone over bytes in memory (its raw speed on this machine);
- read: ``storage.read_bytes`` (unchecked) vs ``PublishedOutput.read_bytes`` (checked, what every
  step now reads with); both are one read of each file;
- read and parse: the above + ``safetensors.torch.load`` (what train and infer do per file);
- TFRecord shards as partition's loader reads them: read + ``decode_tfrecord_file`` with its
  per-record crcs (before) vs read checked against the manifest + decode without the per-record
  crcs (now: the whole-file check covers every byte);
- with --gcs: ``gcs.read_bytes`` with the library's own download check vs the checked read (the
  library's check off, the manifest's on).

    .venv/bin/python benchmarks/checksum_cost.py [--files 8] [--mib 64] [--repeat 5] [--gcs]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import google_crc32c
import numpy as np
import torch
from safetensors.torch import load as load_safetensors

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components import storage  # noqa: E402
from components.partition.store import tensor_bytes  # noqa: E402
from components.storage import gcs  # noqa: E402
from components.tfrecord import decode_tfrecord_file, encode_examples  # noqa: E402

GIB = 1 << 30
DIM = 128  # features per node record


def _partition_file(mib: int, seed: int) -> bytes:
    rows = mib * (1 << 20) // (4 * DIM)
    generator = torch.Generator().manual_seed(seed)
    return tensor_bytes({"features": torch.randn(rows, DIM, generator=generator), "node_id": torch.arange(rows)})


def _shard(mib: int, seed: int) -> bytes:
    rows = mib * (1 << 20) // (4 * DIM + 40)
    rng = np.random.default_rng(seed)
    ints = {"node_id": np.arange(rows, dtype=np.int64), "label": rng.integers(0, 7, rows), "split": rng.integers(0, 3, rows)}
    return encode_examples(ints, {"features": rng.standard_normal((rows, DIM), dtype=np.float32)})


def _publish(root: storage.Uri, files: dict[str, bytes]) -> storage.PublishedOutput:
    with storage.staged_output(root, "benchmark") as staging:
        for name, data in files.items():
            staging.write_bytes(name, data)
        return staging.publish()


def _best(rounds: int, variants: dict[str, Callable[[], object]]) -> dict[str, float]:
    best = dict.fromkeys(variants, float("inf"))
    for _ in range(rounds):
        for name, run in variants.items():  # interleaved, so a noisy neighbour hits all alike
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def _table(title: str, seconds: dict[str, float], gib: float, baseline: str) -> None:
    print(f"\n{title} ({gib:.2f} GiB per round)\n")
    print("| variant | seconds | s/GiB | ratio |")
    print("|---|---:|---:|---:|")
    for name, value in seconds.items():
        print(f"| {name} | {value:.3f} | {value / gib:.3f} | {value / seconds[baseline]:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--gcs", action="store_true", help="also read the partition files from a fake-gcs-server on loopback")
    args = parser.parse_args()

    print(
        f"`{' '.join(sys.argv)}`, {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, {platform.machine()}, {os.cpu_count()} CPUs, "
        f"python {platform.python_version()}, google_crc32c {google_crc32c.implementation}, "
        f"load average before {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    parts = {f"part-{i:05d}/nodes/paper.safetensors": _partition_file(args.mib, i) for i in range(args.files)}
    shards = {f"nodes/paper/shard-{i:05d}.tfrecord": _shard(args.mib, i) for i in range(args.files)}
    part_gib = sum(map(len, parts.values())) / GIB
    shard_gib = sum(map(len, shards.values())) / GIB

    with tempfile.TemporaryDirectory(prefix="gnnflow-checksum-") as tmp:
        published = _publish(storage.parse_uri(Path(tmp) / "parts"), parts)
        tfrecords = _publish(storage.parse_uri(Path(tmp) / "tfr"), shards)
        buffer = next(iter(parts.values()))

        raw = _best(args.repeat, {"google_crc32c.value over bytes in memory": lambda: google_crc32c.value(buffer)})
        seconds = raw["google_crc32c.value over bytes in memory"]
        print(f"\ngoogle_crc32c raw: {len(buffer) / seconds / GIB:.2f} GiB/s ({seconds / (len(buffer) / GIB):.3f} s/GiB), one core")

        unchecked = {rel: published.uri(rel) for rel in parts}
        reads = _best(
            args.repeat,
            {
                "read, unchecked (`storage.read_bytes`)": lambda: [storage.read_bytes(u) for u in unchecked.values()],
                "read, checked (`PublishedOutput.read_bytes`)": lambda: [published.read_bytes(rel) for rel in parts],
                "read + safetensors load, unchecked": lambda: [load_safetensors(storage.read_bytes(u)) for u in unchecked.values()],
                "read + safetensors load, checked": lambda: [load_safetensors(published.read_bytes(rel)) for rel in parts],
            },
        )
        _table(
            f"Partition files: {args.files} x {args.mib} MiB safetensors, local", reads, part_gib, "read, unchecked (`storage.read_bytes`)"
        )

        keys = ({"node_id": 1, "label": 1, "split": 1}, {"features": DIM})
        shard_uris = {rel: tfrecords.uri(rel) for rel in shards}
        decodes = _best(
            args.repeat,
            {
                "read + decode, per-record crcs (before)": lambda: [
                    decode_tfrecord_file(storage.read_bytes(u), *keys, source=str(u)) for u in shard_uris.values()
                ],
                "read checked + decode, no per-record crcs (now)": lambda: [
                    decode_tfrecord_file(tfrecords.read_bytes(rel), *keys, source=rel, verify_crc=False) for rel in shards
                ],
                "read + decode, no check at all": lambda: [
                    decode_tfrecord_file(storage.read_bytes(u), *keys, source=str(u), verify_crc=False) for u in shard_uris.values()
                ],
            },
        )
        _table(
            f"TFRecord shards: {args.files} x ~{args.mib} MiB of {DIM}-float node records, local",
            decodes,
            shard_gib,
            "read + decode, per-record crcs (before)",
        )

        if args.gcs:
            _gcs(args, parts, part_gib)
    print(f"\nload average after {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def _gcs(args: argparse.Namespace, parts: dict[str, bytes], gib: float) -> None:
    from tests.gcs_emulator import GcsEmulator  # noqa: PLC0415 - only with --gcs

    with GcsEmulator() as emulator:
        os.environ.update({"STORAGE_EMULATOR_HOST": emulator.url, "GOOGLE_CLOUD_PROJECT": "test", "GCE_METADATA_HOST": "127.0.0.1:9"})
        emulator.create_bucket("bench")
        published = _publish(storage.parse_uri("gs://bench/parts"), parts)
        uris = {rel: published.uri(rel) for rel in parts}
        reads = _best(
            args.repeat,
            {
                "download, library's check vs the object's hash (before)": lambda: [gcs.read_bytes(u) for u in uris.values()],  # type: ignore[arg-type]
                "download, no check at all": lambda: [gcs.read_bytes(u, checksum=None) for u in uris.values()],  # type: ignore[arg-type]
                "download, checked against the manifest (now)": lambda: [published.read_bytes(rel) for rel in parts],
            },
        )
        _table(
            f"Partition files on fake-gcs-server (loopback): {args.files} x {args.mib} MiB",
            reads,
            gib,
            "download, library's check vs the object's hash (before)",
        )


if __name__ == "__main__":
    main()
