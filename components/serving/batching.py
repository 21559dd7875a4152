"""Micro-batching: the instances of concurrent requests go to the model in one predict call.

A request's instances stay together and in order. A batch holds requests with the same ``k``, at
most ``max_instances`` instances (a larger request goes alone), and waits for company at most
``max_wait_s`` after its first request arrived. One predict runs at a time, in a worker thread,
so the event loop keeps accepting and parsing requests meanwhile; those that arrive during a
predict form the next batch at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

log = logging.getLogger("gnnflow.serve")

In = TypeVar("In")
Out = TypeVar("Out")
PredictFn = Callable[[Sequence[In], int], list[Out]]

DEFAULT_MAX_BATCH = 64
# No wait by default: measured on the arxiv-sized demo (benchmarks/serving.py), a 2 ms wait cost
# every lone request 2 ms and lowered throughput at 16 and 64 in flight, since requests that
# arrive during a predict already form the next batch.
DEFAULT_MAX_WAIT_S = 0.0


@dataclass
class _Waiting(Generic[In, Out]):
    instances: Sequence[In]
    k: int
    arrived: float
    answer: asyncio.Future[list[Out]] = field(repr=False)


@dataclass(frozen=True)
class BatchStats:
    """Counts since start, for the log line at shutdown (and tests)."""

    batches: int
    requests: int
    instances: int


class MicroBatcher(Generic[In, Out]):
    """Gathers requests' instances into batches for ``predict(instances, k)``; start it inside the
    event loop that calls :meth:`submit` and close it there too."""

    def __init__(self, predict: PredictFn, max_instances: int = DEFAULT_MAX_BATCH, max_wait_s: float = DEFAULT_MAX_WAIT_S) -> None:
        if max_instances < 1 or max_wait_s < 0:
            raise ValueError(f"max_instances must be ≥ 1 and max_wait_s ≥ 0, got {max_instances}, {max_wait_s}")
        self._predict, self.max_instances, self.max_wait_s = predict, max_instances, max_wait_s
        self._waiting: list[_Waiting[In, Out]] = []
        self._arrival = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="predict")
        self._task: asyncio.Task[None] | None = None
        self._batches = self._requests = self._instances = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="micro-batcher")

    async def close(self) -> None:
        """Stops taking batches (call it after the last request was answered) and ends the worker thread."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._executor.shutdown(wait=True)

    @property
    def stats(self) -> BatchStats:
        return BatchStats(self._batches, self._requests, self._instances)

    async def submit(self, instances: Sequence[In], k: int) -> list[Out]:
        """The model's answers for ``instances``, in order; raises what predict raised for them."""
        if self._task is None or self._task.done():
            raise RuntimeError("the micro-batcher is not running")
        loop = asyncio.get_running_loop()
        waiting: _Waiting[In, Out] = _Waiting(instances, k, loop.time(), loop.create_future())
        self._waiting.append(waiting)
        self._arrival.set()
        return await waiting.answer

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self._waiting:
                self._arrival.clear()
                await self._arrival.wait()
            batch = await self._gather(loop)
            await self._answer(loop, batch)

    async def _gather(self, loop: asyncio.AbstractEventLoop) -> list[_Waiting[In, Out]]:
        """The oldest waiting request and those that fit beside it, waiting until its deadline."""
        first = self._waiting.pop(0)
        batch, size = [first], len(first.instances)
        deadline = first.arrived + self.max_wait_s
        while size < self.max_instances:
            for waiting in [w for w in self._waiting if w.k == first.k]:
                if size + len(waiting.instances) <= self.max_instances:
                    self._waiting.remove(waiting)
                    batch.append(waiting)
                    size += len(waiting.instances)
            remaining = deadline - loop.time()
            if size >= self.max_instances or remaining <= 0:
                break
            self._arrival.clear()
            try:
                await asyncio.wait_for(self._arrival.wait(), remaining)
            except TimeoutError:
                break
        return batch

    async def _answer(self, loop: asyncio.AbstractEventLoop, batch: list[_Waiting[In, Out]]) -> None:
        """Runs the batch; when it fails, each request alone, so that one bad request (an unknown
        node id only the model finds) fails only itself."""
        live = [w for w in batch if not w.answer.done()]  # a client that went away cancelled its future
        if not live:
            return
        self._batches += 1
        self._requests += len(live)
        instances = [instance for w in live for instance in w.instances]
        self._instances += len(instances)
        started = time.perf_counter()
        try:
            predictions = await loop.run_in_executor(self._executor, self._predict, instances, live[0].k)
        except Exception as exc:
            if len(live) == 1:
                _settle(live[0], exception=exc)
                return
            log.debug("a batch of %d requests failed (%s): answering each alone", len(live), exc)
            for waiting in live:
                await self._answer(loop, [waiting])
            return
        log.debug("batch: %d requests, %d instances, %.1f ms", len(live), len(instances), 1000 * (time.perf_counter() - started))
        if len(predictions) != len(instances):
            error = RuntimeError(f"predict answered {len(predictions)} predictions for {len(instances)} instances")
            for waiting in live:
                _settle(waiting, exception=error)
            return
        offset = 0
        for waiting in live:
            _settle(waiting, result=predictions[offset : offset + len(waiting.instances)])
            offset += len(waiting.instances)


def _settle(waiting: _Waiting[In, Out], *, result: list[Out] | None = None, exception: BaseException | None = None) -> None:
    if waiting.answer.done():
        return
    if exception is not None:
        waiting.answer.set_exception(exception)
    else:
        waiting.answer.set_result(result or [])
