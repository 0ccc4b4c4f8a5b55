"""The one exception type of ster-py."""


class SterError(Exception):
    """An error a user can act on.

    The message says what went wrong and, where there is one, what to do about
    it. The CLI prints it without a traceback and exits with status 1 (status 2
    for command-line usage errors, as Typer does).
    """
