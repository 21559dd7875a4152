"""Data errors found by Beam workers, carried as data and reported in the local engine's order.

A worker that meets bad input does not raise (Beam would retry the bundle and bury the message
in a remote traceback): it emits a :class:`Problem` whose ``order`` sorts like the moment the
one-process engine would have met it, and stops working on that block. The launcher raises
the first one, so both engines report the same message for the same input.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from components.errors import GnnflowError


@dataclass(frozen=True, order=True)
class Problem:
    """A data error: where the one-process engine would meet it, and what it says."""

    order: tuple[int, ...]
    message: str


def first_problem(problems: Iterable[Problem]) -> GnnflowError | None:
    """The error to raise for these problems (the earliest in order), or None if there are none."""
    found = min(problems, default=None)
    return GnnflowError(found.message) if found is not None else None
