"""The micro-batcher of ``gnnflow serve`` (components/serving/batching.py) on a real event loop and
worker thread, with a plain function standing in for the model: concurrent requests share predict
calls, stay whole and in order, respect the batch bound and ``k``, and a failing request fails alone."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import pytest

from components.serving.batching import MicroBatcher


class Model:
    """predict(instances, k) → [(instance, k)], recording each call; an instance "bad" fails the call."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], int]] = []
        self.threads: set[str] = set()

    def predict(self, instances: Sequence[str], k: int) -> list[tuple[str, int]]:
        self.calls.append((list(instances), k))
        self.threads.add(threading.current_thread().name)
        if "bad" in instances:
            raise ValueError("bad instance")
        return [(instance, k) for instance in instances]


async def _submit_all(batcher: MicroBatcher, requests: list[tuple[list[str], int]]) -> list[object]:
    batcher.start()
    try:
        return await asyncio.gather(*(batcher.submit(instances, k) for instances, k in requests), return_exceptions=True)
    finally:
        await batcher.close()


def _requests(count: int, size: int, k: int = 10) -> list[tuple[list[str], int]]:
    return [([f"r{r}i{i}" for i in range(size)], k) for r in range(count)]


def test_concurrent_requests_share_predict_calls_and_each_gets_its_own_answers_in_order() -> None:
    model = Model()
    requests = _requests(12, 3)
    answers = asyncio.run(_submit_all(MicroBatcher(model.predict, max_instances=64, max_wait_s=0.05), requests))
    assert answers == [[(instance, 10) for instance in instances] for instances, _ in requests]
    assert len(model.calls) < len(requests)  # gathered: 12 requests submitted together
    assert sum(len(instances) for instances, _ in model.calls) == 36
    assert all(name.startswith("predict") for name in model.threads)  # never on the event loop's thread


def test_a_batch_never_exceeds_the_bound_and_a_larger_request_goes_whole_and_alone() -> None:
    model = Model()
    requests = [*_requests(10, 5), (["big" + str(i) for i in range(20)], 10)]
    answers = asyncio.run(_submit_all(MicroBatcher(model.predict, max_instances=16, max_wait_s=0.05), requests))
    assert answers[-1] == [(f"big{i}", 10) for i in range(20)]
    sizes = [len(instances) for instances, _ in model.calls]
    assert sorted(sizes, reverse=True)[0] == 20 and all(size <= 15 for size in sizes if size != 20), sizes  # 3 requests of 5 fit in 16
    assert [instances for instances, _ in model.calls if len(instances) == 20] == [[f"big{i}" for i in range(20)]]


def test_requests_with_different_k_never_share_a_call() -> None:
    model = Model()
    requests = [(["a", "b"], 5), (["c"], 7), (["d"], 5), (["e"], 7)]
    answers = asyncio.run(_submit_all(MicroBatcher(model.predict, max_wait_s=0.05), requests))
    assert answers == [[("a", 5), ("b", 5)], [("c", 7)], [("d", 5)], [("e", 7)]]
    for instances, k in model.calls:
        assert {"a": 5, "b": 5, "c": 7, "d": 5, "e": 7}.keys() >= set(instances)
        assert all({"a": 5, "b": 5, "c": 7, "d": 5, "e": 7}[i] == k for i in instances)
    assert len(model.calls) == 2


def test_a_failing_request_fails_alone_and_the_others_in_its_batch_are_answered() -> None:
    model = Model()
    requests = [(["x1", "x2"], 10), (["y", "bad"], 10), (["z"], 10)]
    answers = asyncio.run(_submit_all(MicroBatcher(model.predict, max_wait_s=0.05), requests))
    assert answers[0] == [("x1", 10), ("x2", 10)] and answers[2] == [("z", 10)]
    assert isinstance(answers[1], ValueError) and str(answers[1]) == "bad instance"
    assert model.calls[0] == (["x1", "x2", "y", "bad", "z"], 10)  # tried together first, then one by one
    assert sorted(model.calls[1:]) == [(["x1", "x2"], 10), (["y", "bad"], 10), (["z"], 10)]


def test_a_full_batch_goes_without_waiting_out_the_deadline() -> None:
    model = Model()

    async def scenario() -> list[object]:
        # A 600 s wait: the batch is full at 4 instances, so predict runs at once (the test's own timeout bounds it).
        return await asyncio.wait_for(_submit_all(MicroBatcher(model.predict, max_instances=4, max_wait_s=600), _requests(2, 2)), 60)

    answers = asyncio.run(scenario())
    assert answers == [[("r0i0", 10), ("r0i1", 10)], [("r1i0", 10), ("r1i1", 10)]]
    assert model.calls == [(["r0i0", "r0i1", "r1i0", "r1i1"], 10)]


def test_the_event_loop_keeps_running_while_predict_works() -> None:
    release = threading.Event()
    seen: list[str] = []

    def slow_predict(instances: Sequence[str], k: int) -> list[str]:
        assert release.wait(30), "the event loop never ran while predict was blocked"
        return list(instances)

    async def scenario() -> list[str]:
        batcher: MicroBatcher[str, str] = MicroBatcher(slow_predict, max_wait_s=0)
        batcher.start()
        pending = asyncio.ensure_future(batcher.submit(["a"], 1))
        await asyncio.sleep(0.05)  # predict is now blocked in its thread
        seen.append("loop ran")
        release.set()
        answer = await pending
        await batcher.close()
        return answer

    assert asyncio.run(scenario()) == ["a"]
    assert seen == ["loop ran"]


def test_submit_without_start_and_bad_bounds_are_errors() -> None:
    with pytest.raises(ValueError, match="max_instances must be"):
        MicroBatcher(Model().predict, max_instances=0)

    async def scenario() -> None:
        await MicroBatcher(Model().predict).submit(["a"], 1)

    with pytest.raises(RuntimeError, match="not running"):
        asyncio.run(scenario())
