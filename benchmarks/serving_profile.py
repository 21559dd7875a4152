"""Where one new-node request's time goes, in-process: the functions the server runs, timed one request at a time.

Parse and validation (``parse_request``), the Predictor's ``predict`` (broken down with cProfile
into feature checks, feature encoding, request-edge lookups, sampling, the encoder and the
answers), and serialisation (the JSON the predict route writes). benchmarks/serving.py calls
:func:`profile_request` with --profile; the HTTP round trip and the micro-batcher's wait are
what the served p50 adds to these.
"""

from __future__ import annotations

import cProfile
import json
import pathlib
import pstats
import time

from components.serving.app import _prediction_json
from components.serving.predictor import Predictor
from components.serving.requests import parse_request

# (label, file suffix, function name) of the predictor's parts, read from cProfile's cumulative times.
PARTS = (
    ("feature checks", "serving/encode.py", "check"),
    ("feature encoding", "serving/encode.py", "encode"),
    ("request edges (id lookups)", "serving/predictor.py", "_given"),
    ("sampling (subgraph)", "serving/neighbourhood.py", "build_subgraph"),
    ("encoder (GNN layers)", "serving/subgraph_encoder.py", "encode_seeds"),
    ("answers (head, softmax, lists)", "serving/predictor.py", "_answers"),
)


def profile_request(run_root: pathlib.Path, cache: pathlib.Path, bodies: list[bytes], count: int = 500) -> dict[str, float]:
    """Milliseconds per request of each part (averages over ``count`` single-node requests)."""
    predictor = Predictor.load(str(run_root / "model"), str(run_root / "partitions"), str(run_root / "embeddings"), str(cache))
    bodies = (bodies * (1 + count // len(bodies)))[:count]
    parsed = [parse_request(b, predictor.schema) for b in bodies[:50]]
    for p in parsed:  # warm-up
        predictor.predict(p.instances, p.k)
    parse_s = predict_s = dump_s = 0.0
    for body in bodies:
        start = time.perf_counter()
        request = parse_request(body, predictor.schema)
        mid = time.perf_counter()
        predictions = predictor.predict(request.instances, request.k)
        end = time.perf_counter()
        json.dumps({"predictions": [_prediction_json(p) for p in predictions]})
        parse_s, predict_s, dump_s = parse_s + mid - start, predict_s + end - mid, dump_s + time.perf_counter() - end
    requests = [parse_request(b, predictor.schema) for b in bodies]
    profiler = cProfile.Profile()
    profiler.enable()
    for request in requests:
        predictor.predict(request.instances, request.k)
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    profiled_total = sum(v[3] for (f, _, name), v in stats.items() if f.endswith("serving/predictor.py") and name == "predict")
    out = {"parse and validation": 1000 * parse_s / count, "predict (unprofiled)": 1000 * predict_s / count}
    for label, suffix, function in PARTS:
        cumulative = sum(v[3] for (f, _, name), v in stats.items() if f.endswith(suffix) and name == function)
        # cProfile slows everything; scale each part to the unprofiled predict time.
        out[f"  {label}"] = 1000 * predict_s / count * cumulative / max(profiled_total, 1e-12)
    out["serialisation (JSON)"] = 1000 * dump_s / count
    batch = [r.instances[0] for r in requests[:16]]
    start = time.perf_counter()
    for _ in range(20):
        predictor.predict(batch, 10)
    out["predict, 16 nodes in one call (per node)"] = 1000 * (time.perf_counter() - start) / 20 / 16
    return out
