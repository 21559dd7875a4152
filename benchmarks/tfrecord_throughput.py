"""TFRecord serialize and read throughput: components.tfrecord against the usual TensorFlow code.

One run, one synthetic table (int64 id, label, split; a float32 feature matrix of --dim columns):

1. serialize: `TFRecordWriter.write_examples` (numpy-built Example bytes) against a per-row
   Python loop that builds a `tf.train.Example` and writes it with `tf.io.TFRecordWriter`;
2. read with tf.data (`TFRecordDataset` -> batch -> `tf.io.parse_example` into a (batch, dim)
   matrix): our layout (all features in one packed float list) against GiGL's layout (one key
   per feature column, one float each, stacked after parsing), same data, same batch size;
3. read with our own `iter_records` + `decode_examples` (no TensorFlow).

Each figure is the best of --repeat runs (the first also warms the page cache and tf.function
tracing). Prints a markdown table.

    python benchmarks/tfrecord_throughput.py [--rows 200000] [--dim 64]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from components.tfrecord import TFRecordWriter, decode_examples, iter_records  # noqa: E402

BATCH = 10_000


def synthetic(rows: int, dim: int, seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray]:
    rng = np.random.default_rng(seed)
    ints = {"id": np.arange(rows, dtype=np.int64), "label": rng.integers(-1, 7, rows), "split": rng.integers(0, 3, rows)}
    return ints, rng.standard_normal((rows, dim)).astype(np.float32)


def best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def write_ours(path: Path, ints: dict[str, np.ndarray], feats: np.ndarray, chunk: int) -> None:
    with path.open("wb") as stream:
        writer = TFRecordWriter(stream)
        for lo in range(0, len(feats), chunk):
            writer.write_examples({k: v[lo:lo + chunk] for k, v in ints.items()}, {"feat": feats[lo:lo + chunk]})


def write_tf_loop(path: Path, ints: dict[str, np.ndarray], feats: np.ndarray) -> None:
    # The strongest plain baseline: whole-column tolist() first, then one Example per row.
    ids, labels, splits, rows = (ints["id"].tolist(), ints["label"].tolist(), ints["split"].tolist(), feats.tolist())
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i in range(len(rows)):
            example = tf.train.Example(features=tf.train.Features(feature={
                "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[ids[i]])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[labels[i]])),
                "split": tf.train.Feature(int64_list=tf.train.Int64List(value=[splits[i]])),
                "feat": tf.train.Feature(float_list=tf.train.FloatList(value=rows[i])),
            }))
            writer.write(example.SerializeToString())


def write_gigl_layout(path: Path, ints: dict[str, np.ndarray], feats: np.ndarray, chunk: int) -> list[str]:
    """GiGL's layout, one float key per column; built with our encoder (a Python loop over
    3703 keys per row would take longer than the whole benchmark). Not timed."""
    names = [f"feat_{j:05d}" for j in range(feats.shape[1])]
    with path.open("wb") as stream:
        writer = TFRecordWriter(stream)
        for lo in range(0, len(feats), chunk):
            floats = {name: feats[lo:lo + chunk, j:j + 1] for j, name in enumerate(names)}
            writer.write_examples({k: v[lo:lo + chunk] for k, v in ints.items()}, floats)
    return names


def tf_reader(path: Path, dim: int, float_names: list[str] | None) -> Callable[[], tuple[int, float]]:
    """A tf.data pipeline yielding (ids, (batch, dim) features); returns a full-pass function."""
    spec = {k: tf.io.FixedLenFeature([], tf.int64) for k in ("id", "label", "split")}
    if float_names is None:
        spec["feat"] = tf.io.FixedLenFeature([dim], tf.float32)
    else:
        spec.update({name: tf.io.FixedLenFeature([], tf.float32) for name in float_names})

    def parse(batch: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        parsed = tf.io.parse_example(batch, spec)
        feat = parsed["feat"] if float_names is None else tf.stack([parsed[n] for n in float_names], axis=1)
        return parsed["id"], feat

    dataset = tf.data.TFRecordDataset(str(path)).batch(BATCH).map(parse).prefetch(2)

    def run() -> tuple[int, float]:
        rows, checksum = 0, 0.0
        for ids, feat in dataset:
            rows += int(ids.shape[0])
            checksum += float(tf.reduce_sum(feat[:, :1]))
        return rows, checksum

    return run


def read_ours(path: Path, dim: int) -> tuple[int, float]:
    with path.open("rb", buffering=1 << 20) as stream:
        records = list(iter_records(stream, source=str(path)))
    cols = decode_examples(records, {"id": 1, "label": 1, "split": 1}, {"feat": dim}, source=str(path))
    return len(cols["id"]), float(cols["feat"].reshape(len(records), -1)[:, :1].sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--chunk", type=int, default=50_000, help="rows per encode_examples call")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    ints, feats = synthetic(args.rows, args.dim)
    rows = args.rows

    with tempfile.TemporaryDirectory() as tmp:
        ours, loop, gigl = Path(tmp, "ours.tfrecord"), Path(tmp, "loop.tfrecord"), Path(tmp, "gigl.tfrecord")
        t_ours = best(lambda: write_ours(ours, ints, feats, args.chunk), args.repeat)
        t_loop = best(lambda: write_tf_loop(loop, ints, feats), args.repeat)
        names = write_gigl_layout(gigl, ints, feats, args.chunk)

        read_packed, read_gigl = tf_reader(ours, args.dim, None), tf_reader(gigl, args.dim, names)
        results = {}
        for name, fn in (("packed", read_packed), ("gigl", read_gigl), ("ours", lambda: read_ours(ours, args.dim))):
            results[name] = fn()  # warm-up, and the values every reader must agree on
        assert len({r[0] for r in results.values()}) == 1, results
        assert np.allclose([r[1] for r in results.values()], results["packed"][1], rtol=1e-4), results
        t_packed = best(read_packed, args.repeat)
        t_gigl = best(read_gigl, args.repeat)
        t_read_ours = best(lambda: read_ours(ours, args.dim), args.repeat)
        sizes = {p.name: p.stat().st_size for p in (ours, loop, gigl)}

    print(f"rows={rows} dim={args.dim} batch={BATCH} chunk={args.chunk} repeat={args.repeat} "
          f"python={platform.python_version()} tensorflow={tf.__version__} numpy={np.__version__} cpus={os.cpu_count()}")
    print(f"file sizes: ours {sizes['ours.tfrecord'] / 1e6:.1f} MB, per-row loop {sizes['loop.tfrecord'] / 1e6:.1f} MB, "
          f"GiGL layout {sizes['gigl.tfrecord'] / 1e6:.1f} MB\n")
    print("| measurement | seconds | rows/s | ratio |")
    print("|---|---:|---:|---:|")
    print(f"| serialize: per-row `tf.train.Example` loop + `tf.io.TFRecordWriter` (baseline) | {t_loop:.3f} | "
          f"{rows / t_loop:,.0f} | 1.00x |")
    print(f"| serialize: `encode_examples` + `TFRecordWriter` (ours) | {t_ours:.3f} | {rows / t_ours:,.0f} | "
          f"{t_loop / t_ours:.2f}x |")
    print(f"| read tf.data: GiGL layout, {args.dim} keys of 1 float, stacked (baseline) | {t_gigl:.3f} | "
          f"{rows / t_gigl:,.0f} | 1.00x |")
    print(f"| read tf.data: our layout, 1 packed float key | {t_packed:.3f} | {rows / t_packed:,.0f} | "
          f"{t_gigl / t_packed:.2f}x |")
    print(f"| read without TF: `iter_records` + `decode_examples`, our layout | {t_read_ours:.3f} | "
          f"{rows / t_read_ours:,.0f} | {t_gigl / t_read_ours:.2f}x |")


if __name__ == "__main__":
    main()
