"""What every step's ``python -m components.<step>`` shares: logging and user-facing failures."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Sequence

from components.errors import GnnflowError
from components.runtime.exit_status import EXIT_INTERRUPTED, exit_status
from components.runtime.launcher import VERBOSE_ENV
from components.runtime.runlog import configure


def run_cli(main: Callable[[Sequence[str] | None], object], argv: Sequence[str] | None = None) -> int:
    """Runs ``main``; a :class:`GnnflowError` becomes one line on stderr and the exit status of
    :func:`components.runtime.exit_status.exit_status`: 2, or the error's own ``exit_code`` (75
    for a step stopped by SIGTERM that a rerun resumes), as the step's KFP component ends too.

    ``--verbose`` (any step) is taken out of the arguments here: it makes workers log the
    traceback of expected errors too (by default only unexpected ones carry a traceback).
    """
    configure()
    arguments = list(sys.argv[1:] if argv is None else argv)
    if "--verbose" in arguments:
        arguments.remove("--verbose")
        os.environ[VERBOSE_ENV] = "1"  # the workers inherit it
    try:
        main(arguments)
    except GnnflowError as exc:
        logging.getLogger("gnnflow").error("%s", exc)
        print(f"error: {exc}", file=sys.stderr)
        return exit_status(exc)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0
