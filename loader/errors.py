"""The one exception type the command line turns into a one-line error message."""

__all__ = ["UserError"]


class UserError(Exception):
    """A problem the user can fix (bad input, bad option, no space left).

    The CLI prints ``str(err)`` on one line and exits non-zero; it never shows a traceback
    for these. Messages name the file, field or option and the offending value.
    """
