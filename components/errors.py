"""The one exception type a user sees: a short message naming what was wrong and where."""


class GnnflowError(Exception):
    """A user-facing error (bad input, bad config, unreachable URI).

    Entry points print its message without a traceback and exit non-zero; anything else
    that escapes a step is a bug and keeps its traceback.
    """
