"""Sampling without replacement (``training.replace: false``) in GLT 0.2.4's distributed sampler.

GLT 0.2.4's CPU one-hop draw (``pywrap.CPURandomSampler``) picks each of a node's k neighbours
independently, with replacement: a node of degree 20 sampled with k 15 gets about 11 distinct
neighbours, and a mean aggregates fewer of them than PyG's ``NeighborLoader`` would. Here the
draw is replaced on every partition, for the trainer's own sources and for those its peers ask it
to sample over RPC:

* ``DistNeighborSampler._sample_one_hop`` (once per hop and edge type) takes one key from its
  sampler's generator, seeded with the loader's ``random_seed`` (``training.seed`` + rank). In
  the trainer's own process that generator's state is checkpointed and restored with the run
  (``sampler_key_states``). A sampling subprocess samples ahead of training, so no state of its
  generator matches a batch position: there each batch draws from a generator seeded with the
  loader's seed and the batch's seeds in their order (``use_batch_keys``), a batch being drawn
  the same whenever it is sampled. Either way an epoch resumed at its n-th batch
  (``components.gnn.epoch``) draws what the uninterrupted epoch drew. The sampler hands each
  partition's share of the sources to that partition's ``NeighborSampler`` with a key derived
  from it and the partition: its own directly, a peer's over GLT's RPC (as the
  keyword ``draw_key``, which GLT's RPC callee passes on).
* ``NeighborSampler.sample_one_hop`` given a key draws ``min(k, degree)`` distinct neighbours of
  every source from its partition's CSR, with a generator seeded by that key alone. The draw is a
  function of (key, sources, partition): which RPC thread serves a request, or in which order
  requests from several peers arrive, does not change it, so reruns stay bit-identical.

Samplers built while ``replacement(True)`` is in effect (or GLT sampling subprocesses whose
options say so) keep GLT's own draw. Only the CPU path is replaced; a sampler on a GPU keeps
GLT's CUDA draw.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
from collections.abc import Iterator

import torch

# Rows with more neighbours than this many times k are drawn by rejection (cost O(k) per row)
# instead of by sorting a random key per neighbour (cost O(degree) per row).
SORT_MAX_DEGREE_FACTOR = 4
_KEY_SPACE = 1 << 62
_KEY_BITS = 40  # random bits per neighbour in the sorted draw
_MAX_SORTED_ROWS = 1 << (63 - _KEY_BITS)  # rows sorted at once: their index sits above the random bits
_PARTITION_STRIDE = 0x9E3779B97F4A7C15  # odd: partitions of one call get unrelated keys

_replace = False  # read when a sampler is built (see ``replacement``)
_keys_per_batch = False  # set in sampling subprocesses (see ``use_batch_keys``)
# The generator of the batch being sampled: each batch's coroutine runs in its own context.
_batch_keys: contextvars.ContextVar[torch.Generator | None] = contextvars.ContextVar("gnnflow_batch_keys", default=None)
_installed = False


@contextlib.contextmanager
def replacement(replace: bool) -> Iterator[None]:
    """GLT samplers built inside draw with replacement (GLT's own draw) when ``replace``, else
    without; samplers built elsewhere draw without."""
    global _replace
    before, _replace = _replace, replace
    try:
        yield
    finally:
        _replace = before


def use_batch_keys() -> None:
    """For a GLT sampling subprocess: every batch draws from its own generator (see the module text)."""
    global _keys_per_batch
    _keys_per_batch = True


def sampler_key_states(loaders: dict) -> dict[str, torch.Tensor]:
    """The state of each in-process loader's key generator (``loaders``: name → GLT loader); a
    loader that samples in subprocesses has none here."""
    states = {}
    for name, loader in loaders.items():
        producer = getattr(loader, "_collocated_producer", None)
        sampler = getattr(producer, "_collocated_sampler", None) if producer is not None else None
        if sampler is not None and hasattr(sampler, "gnnflow_keys"):
            states[name] = sampler.gnnflow_keys.get_state()
    return states


def restore_sampler_key_states(loaders: dict, states: dict[str, torch.Tensor]) -> None:
    for name, state in states.items():
        loaders[name]._collocated_producer._collocated_sampler.gnnflow_keys.set_state(state)


def set_replacement(replace: bool) -> None:
    """For a GLT sampling subprocess: the choice every sampler it builds follows."""
    global _replace
    _replace = replace


def _ranks(sizes: torch.Tensor) -> torch.Tensor:
    """Position of every element within its group, for groups of ``sizes`` laid end to end:
    (sizes.sum(),) int64."""
    starts = torch.cumsum(sizes, 0) - sizes
    return torch.arange(int(sizes.sum()), dtype=torch.int64) - torch.repeat_interleave(starts, sizes)


def _sorted_draw(degrees: torch.Tensor, k: int, generator: torch.Generator) -> torch.Tensor:
    """(rows, k) distinct offsets in ``[0, degree)`` per row: the k smallest of one random key
    per neighbour, i.e. the first k of a uniform random permutation. One sort orders the rows
    and, within each, the keys: a row's index in the high bits, 40 random bits below it."""
    rows = degrees.numel()
    if rows > _MAX_SORTED_ROWS:  # the row index must fit above the random bits
        parts = degrees.split(_MAX_SORTED_ROWS)
        return torch.cat([_sorted_draw(part, k, generator) for part in parts])
    owner = torch.repeat_interleave(torch.arange(rows), degrees)
    offset = _ranks(degrees)
    keys = (owner << _KEY_BITS) | torch.randint(1 << _KEY_BITS, (offset.numel(),), generator=generator)
    order = torch.sort(keys, stable=True).indices  # rows in order, random order within each
    return offset[order][offset < k].view(rows, k)  # the first k of each row (a row's i-th slot has rank i)


def _rejection_draw(degrees: torch.Tensor, k: int, generator: torch.Generator) -> torch.Tensor:
    """(rows, k) distinct offsets in ``[0, degree)`` per row for degrees well above k: the first
    k distinct values of 2k uniform draws (a row with fewer draws again). The first k distinct
    values of i.i.d. uniform draws are a uniform k-subset, and redrawing a row depends only on
    how many values it has, not which, so the result stays uniform."""
    result = torch.empty((degrees.numel(), k), dtype=torch.int64)
    pending = torch.arange(degrees.numel())
    width = 2 * k
    while pending.numel():
        degree = degrees[pending].unsqueeze(1)
        draws = (torch.rand((pending.numel(), width), generator=generator, dtype=torch.float64) * degree).long()
        draws = torch.minimum(draws, degree - 1)  # float rounding at the top end
        values, index = draws.sort(dim=1, stable=True)
        first_sorted = torch.ones_like(values, dtype=torch.bool)
        first_sorted[:, 1:] = values[:, 1:] != values[:, :-1]
        first = torch.zeros_like(first_sorted).scatter_(1, index, first_sorted)  # first occurrence, in draw order
        count = first.cumsum(1)
        done = count[:, -1] >= k
        result[pending[done]] = draws[done][(first & (count <= k))[done]].view(-1, k)
        pending = pending[~done]
    return result


def draw_distinct(indptr: torch.Tensor, seeds: torch.Tensor, k: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to ``k`` distinct neighbours of every seed of a CSR whose rows are ``indptr`` (rows + 1,).

    Returns ``counts`` (n,): ``min(k, degree)`` per seed (every neighbour when ``k`` < 0; 0 for
    an id beyond the CSR's rows), and ``positions`` (counts.sum(),): indices into the CSR's
    ``indices`` / edge ids, grouped by seed in seed order.
    """
    seeds = seeds.to(torch.int64)
    inside = (seeds >= 0) & (seeds < indptr.numel() - 1)
    row = torch.where(inside, seeds, 0)
    start = torch.where(inside, indptr[row], 0)
    degree = torch.where(inside, indptr[row + 1] - start, 0)
    counts = degree if k < 0 else degree.clamp(max=k)
    # Each seed's neighbours go straight to its slots of the result, in seed order: no sort.
    first = torch.cumsum(counts, 0) - counts
    positions = torch.empty(int(counts.sum()), dtype=torch.int64)
    whole = (counts == degree).nonzero().view(-1)  # every neighbour, in CSR order
    rows = torch.repeat_interleave(whole, degree[whole])
    rank = _ranks(degree[whole])
    positions[first[rows] + rank] = start[rows] + rank
    if k > 0:
        for pick, draw in (
            ((degree > k) & (degree <= SORT_MAX_DEGREE_FACTOR * k), _sorted_draw),
            (degree > SORT_MAX_DEGREE_FACTOR * k, _rejection_draw),
        ):
            rows = pick.nonzero().view(-1)
            if rows.numel():
                slots = first[rows].unsqueeze(1) + torch.arange(k)
                positions[slots.view(-1)] = (start[rows].unsqueeze(1) + draw(degree[rows], k, generator)).view(-1)
    return counts, positions


def partition_key(key: int, partition: int) -> int:
    """The key a partition draws one call's sources with."""
    return (key + partition * _PARTITION_STRIDE) % _KEY_SPACE


def install() -> None:
    """Patches GLT's ``NeighborSampler`` and ``DistNeighborSampler`` in this process (once; called
    by ``glt_compat.install``, after its fix 1, whose empty-sources answer this keeps)."""
    global _installed
    if _installed:
        return
    from graphlearn_torch.distributed.dist_neighbor_sampler import DistNeighborSampler
    from graphlearn_torch.distributed.event_loop import wrap_torch_future
    from graphlearn_torch.distributed.rpc import rpc_request_async
    from graphlearn_torch.sampler import NeighborOutput, NeighborSampler

    glt_sample_one_hop = NeighborSampler.sample_one_hop

    def sample_one_hop(self, input_seeds: torch.Tensor, req_num: int, etype=None, draw_key: int | None = None):  # noqa: ANN001
        if draw_key is None:
            return glt_sample_one_hop(self, input_seeds, req_num, etype)
        topo = (self.graph[etype] if etype is not None else self.graph).topo
        generator = torch.Generator().manual_seed(draw_key)
        counts, positions = draw_distinct(topo.indptr, input_seeds.cpu(), req_num, generator)
        edges = topo.edge_ids[positions] if self.with_edge else None
        return NeighborOutput(topo.indices[positions], counts, edges)

    NeighborSampler.sample_one_hop = sample_one_hop

    glt_init = DistNeighborSampler.__init__
    glt_dist_one_hop = DistNeighborSampler._sample_one_hop

    def init(self, *args, **kwargs) -> None:  # noqa: ANN001
        glt_init(self, *args, **kwargs)
        # The partition's graph, not the trainer, decides: a CPU graph is sampled on the CPU.
        self.gnnflow_distinct = not _replace and self.sampler.device.type == "cpu"
        seed = self.seed if self.seed is not None else int(torch.randint(_KEY_SPACE, (1,)))
        self.gnnflow_keys = torch.Generator().manual_seed(seed % _KEY_SPACE)

    async def dist_sample_one_hop(self, srcs: torch.Tensor, num_nbr: int, etype):  # noqa: ANN001, ANN202
        if not getattr(self, "gnnflow_distinct", False) or srcs.numel() == 0:
            return await glt_dist_one_hop(self, srcs, num_nbr, etype)
        # Taken before the first await: with one batch in flight per sampler (GLT's collocated
        # sampler; worker_concurrency 1), calls take their keys in a fixed order.
        keys = _batch_keys.get()
        key = int(torch.randint(_KEY_SPACE, (1,), generator=self.gnnflow_keys if keys is None else keys))
        device, srcs = srcs.device, srcs.cpu()
        if self.data.graph_caching:  # every worker holds the whole graph
            return self.sampler.sample_one_hop(srcs, num_nbr, etype, draw_key=key).to(device)
        src_type = None if etype is None else (etype[0] if self.edge_dir == "out" else etype[-1])
        book = self.dist_graph.node_pb[src_type] if isinstance(self.dist_graph.node_pb, dict) else self.dist_graph.node_pb
        owners = self.dist_graph.get_node_partitions(srcs, src_type).cpu()
        parts, asked = [], []
        for partition in range(self.data.num_partitions):
            mask = owners == partition
            if not bool(mask.any()):
                continue
            ids = self.data.id_select(srcs, mask, book)
            where = mask.nonzero().view(-1)
            part_key = partition_key(key, partition)
            if partition == self.data.partition_idx:
                parts.append((where, self.sampler.sample_one_hop(ids, num_nbr, etype, draw_key=part_key)))
            else:
                future = rpc_request_async(
                    self.rpc_router.get_to_worker(partition),
                    self.rpc_sample_callee_id,
                    args=(ids.cpu(), num_nbr, etype),
                    kwargs={"draw_key": part_key},
                )
                asked.append((where, future))
        if asked:
            answers = await wrap_torch_future(torch.futures.collect_all([future for _, future in asked]))
            parts += [(where, answer.wait()) for (where, _), answer in zip(asked, answers)]
        return stitch(srcs.numel(), parts, self.with_edge).to(device)

    glt_from_nodes, glt_from_edges = DistNeighborSampler._sample_from_nodes, DistNeighborSampler._sample_from_edges

    async def sample_from_nodes(self, inputs):  # noqa: ANN001, ANN202
        if _keys_per_batch:
            _batch_keys.set(batch_generator(self, inputs.node, inputs.input_type))
        return await glt_from_nodes(self, inputs)

    async def sample_from_edges(self, inputs):  # noqa: ANN001, ANN202
        if _keys_per_batch:
            _batch_keys.set(batch_generator(self, torch.stack([inputs.row, inputs.col]), inputs.input_type))
        return await glt_from_edges(self, inputs)

    DistNeighborSampler.__init__ = init
    DistNeighborSampler._sample_one_hop = dist_sample_one_hop
    DistNeighborSampler._sample_from_nodes = sample_from_nodes
    DistNeighborSampler._sample_from_edges = sample_from_edges
    _installed = True


def batch_generator(sampler, seeds: torch.Tensor, input_type) -> torch.Generator | None:  # noqa: ANN001
    """The generator of one batch's draws: seeded with the sampler's seed, the batch's seeds (in
    their order) and their type; None for a sampler without a seed (its own generator then)."""
    if getattr(sampler, "seed", None) is None:
        return None
    digest = hashlib.blake2b(seeds.detach().cpu().to(torch.int64).contiguous().numpy().tobytes(), digest_size=8)
    digest.update(f"{sampler.seed}|{input_type}".encode())
    return torch.Generator().manual_seed(int.from_bytes(digest.digest(), "little") % _KEY_SPACE)


def stitch(num_sources: int, parts: list, with_edge: bool):
    """One ``NeighborOutput`` for ``num_sources`` sources from per-partition outputs, each given
    with the positions (among the sources) of the sources it answers."""
    from graphlearn_torch.sampler import NeighborOutput

    counts = torch.zeros(num_sources, dtype=torch.int64)
    for where, output in parts:
        counts[where] = output.nbr_num
    owner = torch.cat([torch.repeat_interleave(where, output.nbr_num) for where, output in parts])
    order = torch.argsort(owner, stable=True)
    neighbours = torch.cat([output.nbr for _, output in parts])[order]
    edges = torch.cat([output.edge for _, output in parts])[order] if with_edge else None
    return NeighborOutput(neighbours, counts, edges)
