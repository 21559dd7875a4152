"""Progress reporting: a bar on a terminal, periodic log lines elsewhere (pipeline tasks, CI logs)."""

from __future__ import annotations

import io
import logging
import sys

from tqdm import tqdm

from components.runtime.runlog import LoggedProgress, progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_no_bar_without_a_terminal_but_log_lines(monkeypatch, caplog):
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    bar = progress("write nodes[paper]", total=1000)
    assert isinstance(bar, LoggedProgress)
    bar.interval_s = 0.0  # every update logs here; a run logs every PROGRESS_LOG_INTERVAL_S
    with caplog.at_level(logging.INFO, logger="gnnflow.progress"), bar:
        bar.update(250)
        bar.update(250)
    assert "\r" not in stream.getvalue(), "nothing redrawn with carriage returns"
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert messages[1].startswith("write nodes[paper]: 500 rows (50% of 1,000), ")


def test_quiet_between_intervals(monkeypatch, caplog):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    with caplog.at_level(logging.INFO, logger="gnnflow.progress"), progress("train", unit="batch") as bar:
        for _ in range(100):
            bar.update(1)
    assert bar.n == 100 and caplog.records == []


def test_a_bar_on_a_terminal(monkeypatch):
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with progress("serialize", total=10) as bar:
        assert isinstance(bar, tqdm)
        bar.update(10)
    assert "serialize" in terminal.getvalue()
