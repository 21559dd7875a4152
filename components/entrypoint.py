"""What every step's ``python -m components.<step>`` shares: logging and user-facing failures."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence

from components.errors import GnnflowError
from components.runlog import configure


def run_cli(main: Callable[[Sequence[str] | None], object], argv: Sequence[str] | None = None) -> int:
    """Runs ``main``; a :class:`GnnflowError` becomes one line on stderr and exit code 2."""
    configure()
    try:
        main(argv)
    except GnnflowError as exc:
        logging.getLogger("gnnflow").error("%s", exc)
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0
