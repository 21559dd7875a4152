"""The GLT fixes refuse a GLT release other than the one whose private functions they replace."""

from __future__ import annotations

import importlib.metadata

import pytest

from components.errors import GnnflowError
from components.train import glt_compat


def test_the_locked_release_is_accepted():
    assert importlib.metadata.version("graphlearn-torch") == glt_compat.GLT_VERSION
    glt_compat.check_version()  # the installed one


@pytest.mark.parametrize("installed", ["0.2.5", "0.3.0", "none"])
def test_another_release_is_refused_naming_both(installed):
    with pytest.raises(GnnflowError) as error:
        glt_compat.check_version(installed)
    assert f"graphlearn-torch {installed} is installed" in str(error.value)
    assert "graphlearn-torch==0.2.4" in str(error.value)
