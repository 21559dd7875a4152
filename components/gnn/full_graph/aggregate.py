"""Sequential aggregation with rematerialization: sum and max over every neighbour of a worker's
nodes, one peer's block (in chunks) at a time, as autograd functions.

Forward: for each step of the plan's ring, the worker sends the chunks of its own rows that the
served peer reads and receives the chunks it reads from the fetched peer, folds each received
chunk into its (n, d) result, and drops it. Nothing fetched is kept for backward:

- sum: the gradient of a fetched row is the sum of its readers' output gradients, which does not
  depend on the row's value; each chunk's row gradients go back to the owner, who adds them to
  the gradient of its own rows.
- max: which neighbour won does depend on the values, so backward fetches every chunk again
  (rematerialization) and routes each output gradient to the rows equal to the maximum.

The sum's step 0 (a worker's own rows) is one sparse product over the local rows, without
copying them (:func:`_local`). Both save only local tensors (max: its local input, output and
tie counts, (n, d) each).
Every worker must run the same layers in the same order (the sends pair up step by step).
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist

from components.gnn.full_graph.plan import AggregationPlan
from components.runtime import watchdog


def _swap(send: torch.Tensor | None, to: int, receive: tuple[int, ...] | None, source: int, dtype: torch.dtype) -> torch.Tensor | None:
    """Sends ``send`` to ``to`` while receiving a ``receive``-shaped tensor from ``source``; both
    are posted before either is waited on, so two workers swapping with each other never block."""
    works, received = [], None
    if send is not None:
        works.append(dist.isend(send.contiguous(), to))
    if receive is not None:
        received = torch.empty(receive, dtype=dtype)
        works.append(dist.irecv(received, source))
    with watchdog.phase("all-reduce"):
        for work in works:
            if work is not None:  # None only for a rank outside the group, which these never are
                work.wait()
    return received


def _ring(plan: AggregationPlan, step: int, h: torch.Tensor):
    """Yields (chunk, (rows, d) values fetched) for step ``step``, serving this step's peer the
    chunks of ``h`` it reads meanwhile; the caller may send the chunk's gradient back by
    calling :func:`_return_gradient` before the next chunk."""
    block, serve = plan.fetch[step], plan.serve[step]
    fetched, served = plan.fetch_chunks(step), plan.serve_chunks(step)
    if step == 0:
        for chunk, (start, end) in enumerate(fetched):
            yield chunk, h.index_select(0, serve[start:end])
        return
    for chunk in range(max(len(fetched), len(served))):
        send = h.index_select(0, serve[slice(*served[chunk])]) if chunk < len(served) else None
        shape = (fetched[chunk][1] - fetched[chunk][0], h.shape[1]) if chunk < len(fetched) else None
        values = _swap(send, plan.served_peer(step), shape, block.peer, h.dtype)
        yield chunk, values


def _return_gradient(plan: AggregationPlan, step: int, chunk: int, gradient: torch.Tensor | None, grad_h: torch.Tensor) -> None:
    """Sends ``gradient`` ((rows, d) of the fetched chunk, None past the last) to its owner and
    adds what the served peer sends back for its chunk of this worker's rows into ``grad_h``."""
    serve, served = plan.serve[step], plan.serve_chunks(step)
    if step == 0:
        if gradient is not None:
            grad_h.index_add_(0, serve[slice(*served[chunk])], gradient)
        return
    shape = (served[chunk][1] - served[chunk][0], grad_h.shape[1]) if chunk < len(served) else None
    back = _swap(gradient, plan.fetch[step].peer, shape, plan.served_peer(step), grad_h.dtype)
    if back is not None:
        grad_h.index_add_(0, serve[slice(*served[chunk])], back)


def _edges(plan: AggregationPlan, step: int, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(e_c,) local rows and (e_c,) indices into the chunk of the edges reading chunk ``chunk``."""
    block = plan.fetch[step]
    lo, hi = block.edge_ptr[chunk], block.edge_ptr[chunk + 1]
    start = plan.fetch_chunks(step)[chunk][0]
    return block.rows[lo:hi], block.cols[lo:hi] - start


def _adjacency(plan: AggregationPlan, step: int, chunk: int, transpose: bool) -> torch.Tensor:
    """Chunk ``chunk`` of step ``step``'s edges as a sparse CSR matrix (n, rows of the chunk) of
    edge counts, or its transpose: a sparse product sums neighbours without an (edges, d)
    tensor of messages. Built once per plan (as many entries as the worker holds edges)."""
    key = (step, chunk, transpose)
    if key not in plan.cache:
        rows, cols = _edges(plan, step, chunk)
        start, end = plan.fetch_chunks(step)[chunk]
        index = torch.stack([cols, rows] if transpose else [rows, cols])
        size = (end - start, plan.num_rows) if transpose else (plan.num_rows, end - start)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
            plan.cache[key] = torch.sparse_coo_tensor(index, torch.ones(len(rows)), size).coalesce().to_sparse_csr()
    return plan.cache[key]


def _local(plan: AggregationPlan, transpose: bool) -> torch.Tensor:
    """Step 0's edges (those between this worker's own rows) as one sparse CSR matrix (n, n) over
    the local rows themselves, or its transpose: the local sum is one product, with no copy of
    the rows it reads. Built once per plan."""
    key = ("local", transpose)
    if key not in plan.cache:
        block = plan.fetch[0]
        rows, cols = block.rows, plan.serve[0][block.cols]  # step 0 serves itself: fetched row i is local row serve[i]
        index = torch.stack([cols, rows] if transpose else [rows, cols])
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
            size = (plan.num_rows, plan.num_rows)
            plan.cache[key] = torch.sparse_coo_tensor(index, torch.ones(len(rows)), size).coalesce().to_sparse_csr()
    return plan.cache[key]


def _sum_forward(plan: AggregationPlan, h: torch.Tensor) -> torch.Tensor:
    out = _local(plan, transpose=False) @ h
    for step in range(1, plan.world_size):
        for chunk, values in _ring(plan, step, h):
            if values is not None:
                out += _adjacency(plan, step, chunk, transpose=False) @ values
    return out


def _sum_backward(plan: AggregationPlan, grad_out: torch.Tensor) -> torch.Tensor:
    grad_h = _local(plan, transpose=True) @ grad_out
    for step in range(1, plan.world_size):
        fetched = plan.fetch_chunks(step)
        for chunk in range(max(len(fetched), len(plan.serve_chunks(step)))):
            gradient = None
            if chunk < len(fetched):
                gradient = _adjacency(plan, step, chunk, transpose=True) @ grad_out
            _return_gradient(plan, step, chunk, gradient, grad_h)
    return grad_h


class SequentialSum(torch.autograd.Function):
    """(n, d) rows of this worker → (n, d) sums over each node's neighbours (on any worker)."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, plan: AggregationPlan) -> torch.Tensor:
        ctx.plan = plan
        return _sum_forward(plan, h.contiguous())

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        return _sum_backward(ctx.plan, grad_out.contiguous()), None


def _max_forward(plan: AggregationPlan, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, d) maxima (0 for a node without neighbours, as PyG) and (n, d) how many neighbours
    attain each, folded chunk by chunk."""
    width = h.shape[1]
    best = torch.full((plan.num_rows, width), float("-inf"), dtype=h.dtype)
    ties = torch.zeros((plan.num_rows, width), dtype=h.dtype)
    for step in range(plan.world_size):
        for chunk, values in _ring(plan, step, h):
            if values is None:
                continue
            rows, cols = _edges(plan, step, chunk)
            messages = values.index_select(0, cols)
            index = rows.unsqueeze(1).expand_as(messages)
            chunk_best = torch.full_like(best, float("-inf")).scatter_reduce_(0, index, messages, "amax")
            chunk_ties = torch.zeros_like(ties).index_add_(0, rows, (messages == chunk_best[rows]).to(h.dtype))
            ties = torch.where(chunk_best > best, chunk_ties, torch.where(chunk_best == best, ties + chunk_ties, ties))
            best = torch.maximum(best, chunk_best)
    return torch.where(plan.degree.unsqueeze(1) > 0, best, torch.zeros_like(best)), ties


def _max_backward(plan: AggregationPlan, h: torch.Tensor, out: torch.Tensor, ties: torch.Tensor, grad_out: torch.Tensor) -> torch.Tensor:
    # torch's scatter_reduce(amax, include_self=False), which PyG's max aggregation runs on the
    # CPU, shares a gradient among the tied maxima and the zero it starts from when the maximum
    # is 0: the same split here keeps gradients equal to PyG's.
    shares = ties + ((out == 0) & (plan.degree.unsqueeze(1) > 0)).to(out.dtype)
    per_winner = grad_out / shares.clamp(min=1)
    grad_h = torch.zeros_like(h)
    for step in range(plan.world_size):
        for chunk, values in _ring(plan, step, h):  # the blocks, fetched again
            gradient = None
            if values is not None:
                rows, cols = _edges(plan, step, chunk)
                won = values.index_select(0, cols) == out[rows]
                gradient = torch.zeros_like(values).index_add_(0, cols, won.to(values.dtype) * per_winner[rows])
            _return_gradient(plan, step, chunk, gradient, grad_h)
    return grad_h


class SequentialMax(torch.autograd.Function):
    """(n, d) rows of this worker → (n, d) element-wise maxima over each node's neighbours."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, plan: AggregationPlan) -> torch.Tensor:
        h = h.contiguous()
        out, ties = _max_forward(plan, h)
        ctx.plan = plan
        ctx.save_for_backward(h, out, ties)
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        h, out, ties = ctx.saved_tensors
        return _max_backward(ctx.plan, h, out, ties, grad_out.contiguous()), None


def aggregate(h: torch.Tensor, plan: AggregationPlan, reduce: str) -> torch.Tensor:
    """(n, d) → (n, d) ``reduce`` (sum, mean or max) over each local node's neighbours; collective."""
    if reduce == "max":
        return SequentialMax.apply(h, plan)
    total = SequentialSum.apply(h, plan)
    return total / plan.degree.clamp(min=1).unsqueeze(1) if reduce == "mean" else total
