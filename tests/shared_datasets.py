"""The real graphs in ../shared/datasets that tests read, and what a test does where they are absent.

Locally a missing ../shared skips those tests with the reason; under ``CI=true`` it fails them,
so that CI never passes without having run them.
"""

from __future__ import annotations

import os
import pathlib

import pytest

CITESEER = pathlib.Path(__file__).resolve().parents[2] / "shared" / "datasets" / "citeseer"
_MISSING = f"CiteSeer tables not found at {CITESEER} (../shared is absent)"
_REQUIRED = os.environ.get("CI", "").lower() in ("true", "1")


def require_citeseer() -> None:
    """Skips the calling test or fixture where CiteSeer is absent; fails it under CI=true."""
    if not (CITESEER / "nodes.csv.gz").exists():
        if _REQUIRED:
            pytest.fail(f"{_MISSING}, and CI=true requires it")
        pytest.skip(_MISSING)


# Marks a test (or, as ``pytestmark``, a module) ``citeseer``: tests/conftest.py runs
# require_citeseer() before any fixture of such a test is set up.
needs_citeseer = pytest.mark.citeseer
