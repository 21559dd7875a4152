"""Retrieval output: the top-k destination candidates of every source node of the link-prediction
target type, found across all workers without any worker holding all destinations.

Each worker indexes the destination embeddings it owns (a faiss HNSW graph over inner products,
or an exact flat index when the destination type is small). Queries travel in rounds: every
worker contributes a block of its own sources' embeddings, every worker searches the gathered
blocks in its own index, and each query's owner merges the P partial top-k lists into its final
list. Per worker that is O(own destinations + P x block) memory, whatever the graph size. The
score is the inner product of the two embeddings: the ``dot`` decoder's logit.

For a seeded sample of queries every worker also answers exactly (a matrix product over its own
destinations), which gives the ANN recall@k against exact search.
"""

from __future__ import annotations

import io
import logging
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from components import storage
from components.config import RetrievalSpec
from components.gnn.metrics import all_gather_cat
from components.partition.output import hash_owner, range_ends, range_owner
from components.runtime.collectives import all_max_int, all_sum_int, exchange, request_strings
from components.runtime.runlog import rate

log = logging.getLogger("gnnflow.infer")
logging.getLogger("faiss.loader").setLevel(logging.WARNING)  # which CPU build it tried first is no news to a user

CANDIDATES_DIR, INDEX_DIR = "retrieval/candidates", "retrieval/index"
NO_CANDIDATE = -1


@dataclass(frozen=True)
class OwnNodes:
    """One node type's nodes on this worker: partition ids (n,), embeddings (n, hidden) and
    original ids (n strings), rows in the same order."""

    ids: torch.Tensor
    embeddings: torch.Tensor
    originals: pa.Array


@dataclass(frozen=True)
class Candidates:
    """Top-k of this worker's sources: candidate partition ids and scores (n, k), best first;
    ``exact_hits`` / ``exact_total``: how many of the sampled queries' exact top-k the ANN lists hold."""

    ids: torch.Tensor
    scores: torch.Tensor
    exact_hits: int
    exact_total: int


def build_index(embeddings: torch.Tensor, exact: bool, spec: RetrievalSpec, search_threads: int = 1):
    """A faiss inner-product index over (n, hidden) embeddings (row i = the i-th own node),
    searched with ``search_threads`` (the thread plan's faiss count)."""
    import faiss

    dim = embeddings.shape[1]
    index: faiss.Index
    if exact:
        index = faiss.IndexFlatIP(dim)
    else:
        index = faiss.IndexHNSWFlat(dim, spec.hnsw_neighbors, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = spec.ef_construction
        index.hnsw.efSearch = spec.ef_search
    faiss.omp_set_num_threads(1)  # HNSW inserts in parallel in a timing-dependent order: one thread builds the same graph every run
    if len(embeddings):
        index.add(np.ascontiguousarray(embeddings.numpy(), dtype=np.float32))
    faiss.omp_set_num_threads(search_threads)  # queries are searched independently: the same results on any count
    return index


def _local_top(index, own: OwnNodes, queries: torch.Tensor, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(m, depth) scores and partition ids of the best own destinations of each query (padded
    with -inf / NO_CANDIDATE where this worker holds fewer)."""
    scores = torch.full((len(queries), depth), -float("inf"))
    ids = torch.full((len(queries), depth), NO_CANDIDATE, dtype=torch.int64)
    found = min(depth, len(own.ids))
    if found and len(queries):
        d, rows = index.search(np.ascontiguousarray(queries.numpy(), dtype=np.float32), found)
        rows_t = torch.from_numpy(rows).to(torch.int64)
        valid = rows_t >= 0
        scores[:, :found] = torch.where(valid, torch.from_numpy(d), torch.tensor(-float("inf")))
        ids[:, :found] = torch.where(valid, own.ids[rows_t.clamp(min=0)], torch.tensor(NO_CANDIDATE))
    return scores, ids


def _exact_top(own: OwnNodes, queries: torch.Tensor, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    scores = torch.full((len(queries), depth), -float("inf"))
    ids = torch.full((len(queries), depth), NO_CANDIDATE, dtype=torch.int64)
    found = min(depth, len(own.ids))
    if found and len(queries):
        top = torch.topk(queries @ own.embeddings.T, found, dim=1)
        scores[:, :found], ids[:, :found] = top.values, own.ids[top.indices]
    return scores, ids


def _merge(scores: torch.Tensor, ids: torch.Tensor, query_ids: torch.Tensor | None, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(b, P*depth) partial lists → (b, k) best, the query itself left out (``query_ids`` when
    sources and destinations are one node type); ties go to the smaller candidate id."""
    if query_ids is not None:
        scores = torch.where(ids == query_ids.reshape(-1, 1), torch.tensor(-float("inf")), scores)
    by_id = torch.argsort(ids, dim=1, stable=True)
    scores, ids = scores.gather(1, by_id), ids.gather(1, by_id)
    best = torch.argsort(-scores, dim=1, stable=True)[:, :k]
    return scores.gather(1, best), ids.gather(1, best)


def search_everywhere(
    index, sources: OwnNodes, destinations: OwnNodes, k: int, same_type: bool, spec: RetrievalSpec, world_size: int
) -> Candidates:
    """Every own source's top-k destinations over all workers' indexes; collective."""
    depth = k + int(same_type)  # the query may find itself
    sampled = hash_owner(sources.ids, max(1, round(1 / spec.recall_sample_fraction)), spec.seed) == 0
    rounds = all_max_int(-(-len(sources.ids) // spec.query_block))
    out_scores, out_ids, hits, total = [], [], 0, 0
    for r in range(rounds):
        block = slice(r * spec.query_block, (r + 1) * spec.query_block)
        queries, mine_sampled = sources.embeddings[block], sampled[block]
        sizes = [int(s) for s in all_gather_cat(torch.tensor([len(queries)]))]
        gathered, gathered_sampled = all_gather_cat(queries), all_gather_cat(mine_sampled)
        scores, ids = _local_top(index, destinations, gathered, depth)
        exact_scores, exact_ids = _exact_top(destinations, gathered[gathered_sampled], depth)
        full_exact = torch.full_like(ids, NO_CANDIDATE)
        full_exact[gathered_sampled] = exact_ids
        full_exact_scores = torch.full_like(scores, -float("inf"))
        full_exact_scores[gathered_sampled] = exact_scores
        askers = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
        back = exchange({"scores": scores, "ids": ids, "exact_scores": full_exact_scores, "exact_ids": full_exact}, askers, world_size)
        # Received grouped by answering worker: (P, b, depth) → (b, P * depth).
        b = len(queries)

        def per_query(t: torch.Tensor, b: int = b) -> torch.Tensor:
            return t.reshape(-1, b, depth).transpose(0, 1).reshape(b, -1)

        query_ids = sources.ids[block] if same_type else None
        top_scores, top_ids = _merge(per_query(back["scores"]), per_query(back["ids"]), query_ids, k)
        if bool(mine_sampled.any()):
            _, exact = _merge(per_query(back["exact_scores"]), per_query(back["exact_ids"]), query_ids, k)
            chosen, truth = top_ids[mine_sampled], exact[mine_sampled]
            hits += int(((chosen.unsqueeze(2) == truth.unsqueeze(1)) & (truth.unsqueeze(1) != NO_CANDIDATE)).any(1).sum())
            total += int((truth != NO_CANDIDATE).sum())
        out_scores.append(top_scores)
        out_ids.append(top_ids)
    empty = torch.zeros((0, k))
    return Candidates(
        torch.cat(out_ids) if out_ids else empty.to(torch.int64),
        torch.cat(out_scores) if out_scores else empty,
        all_sum_int(hits),
        all_sum_int(total),
    )


def candidate_table(sources: OwnNodes, candidates: Candidates, destination_originals: pa.Array) -> pa.Table:
    """One row per (source, candidate): node_id, candidate_id (original ids), score, rank (1..k)."""
    n, k = candidates.ids.shape
    return pa.table(
        {
            "node_id": sources.originals.take(pa.array(np.repeat(np.arange(n), k))),
            "candidate_id": destination_originals,
            "score": pa.array(candidates.scores.reshape(-1).numpy().astype(np.float32)),
            "rank": pa.array(np.tile(np.arange(1, k + 1, dtype=np.int32), n)),
        }
    )


def write_retrieval(
    staging: storage.OutputStaging,
    rank: int,
    sources: OwnNodes,
    destinations: OwnNodes,
    destination_counts: list[int],
    spec: RetrievalSpec,
    same_type: bool,
    world_size: int,
    threads: int = 1,
) -> dict:
    """Builds this worker's index, searches (with ``threads``), writes its candidate shard and
    index shard; returns the summed retrieval figures (collective)."""
    import faiss

    start = time.perf_counter()
    total_destinations = sum(destination_counts)
    k = min(spec.k, total_destinations - int(same_type))
    exact = total_destinations < spec.exact_below
    index = build_index(destinations.embeddings, exact, spec, threads)
    candidates = search_everywhere(index, sources, destinations, k, same_type, spec, world_size)
    ends = range_ends(destination_counts)
    offset = int(ends[rank - 1]) if rank else 0
    flat = candidates.ids.reshape(-1)
    if bool((flat == NO_CANDIDATE).any()):
        raise RuntimeError(f"rank {rank}: a source got fewer than {k} candidates from {total_destinations} destinations")
    originals = request_strings(
        flat, range_owner(flat, ends), world_size, lambda asked: destinations.originals.take(pa.array((asked - offset).numpy()))
    )
    buffer = io.BytesIO()
    pq.write_table(candidate_table(sources, candidates, originals), buffer)
    staging.write_bytes(f"{CANDIDATES_DIR}/part-{rank:05d}.parquet", buffer.getvalue())
    staging.write_bytes(f"{INDEX_DIR}/part-{rank:05d}.faiss", faiss.serialize_index(index).tobytes())
    ids = io.BytesIO()
    pq.write_table(pa.table({"row": pa.array(np.arange(len(destinations.ids), dtype=np.int64)), "node_id": destinations.originals}), ids)
    staging.write_bytes(f"{INDEX_DIR}/part-{rank:05d}.ids.parquet", ids.getvalue())
    seconds = time.perf_counter() - start
    log.info(
        "rank %d: retrieval: top-%d of %d sources over %d destinations (%s index) in %.1fs (%s)",
        rank,
        k,
        len(sources.ids),
        total_destinations,
        "exact" if exact else "HNSW",
        seconds,
        rate(len(sources.ids), seconds),
    )
    return {
        "retrieval_k": k,
        "retrieval_index": "flat" if exact else "hnsw",
        f"test_ann_recall@{k}_vs_exact": candidates.exact_hits / max(candidates.exact_total, 1),
        "retrieval_recall_checked": candidates.exact_total,
    }
