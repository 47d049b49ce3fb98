"""The project's user-facing errors: a mistake in a value the user gave, said in one line.

Each names the value and what is accepted; the ``pipeline`` command prints it
as ``error: ...`` without a traceback and exits 2, nothing already written is
lost. Anything else that goes wrong is a bug and keeps its traceback. All are
``ValueError`` subclasses, so the decoder's documented ``ValueError`` holds.
"""


class UserError(ValueError):
    """A bad value from the user (config, cell, command line, arguments)."""


class ArgumentError(UserError):
    """A bad argument to the decoder, raised before any forward pass."""


def one_line(err: BaseException, limit: int = 200) -> str:
    """An exception as its type and the first line of its message (at most ``limit`` characters)."""
    first = (str(err).strip().splitlines() or [""])[0][:limit]
    return f"{type(err).__name__}: {first}".rstrip(": ")
