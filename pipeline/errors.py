"""The project's user-facing errors: a mistake in a value the user gave, said in one line.

Each names the value and what is accepted; the ``pipeline`` command prints it
as ``error: ...`` without a traceback and exits 2, nothing already written is
lost. Anything else that goes wrong is a bug and keeps its traceback. All are
``ValueError`` subclasses, so the decoder's documented ``ValueError`` holds.
"""

MAX_MESSAGE = 500  # characters of a one-line error: a longer one (a value echoed whole) is cut, its size said


class UserError(ValueError):
    """A bad value from the user (config, cell, command line, arguments). Its text is one readable line: past
    ``MAX_MESSAGE`` characters its middle is cut and says how much (a 200 MB value is not echoed back)."""

    def __str__(self) -> str:
        return "\n".join(map(readable, super().__str__().split("\n")))  # a list of problems: each line cut


def readable(line: str) -> str:
    """``line`` itself, or past ``MAX_MESSAGE`` characters its start and its end (a long value is echoed in the
    middle; what is wrong with it and what is accepted come last) with how much was cut between them."""
    if len(line) <= MAX_MESSAGE:
        return line
    head, tail = MAX_MESSAGE - 220, 160
    return f"{line[:head]} ... ({len(line) - head - tail:,} characters cut) ... {line[-tail:]}"


class ArgumentError(UserError):
    """A bad argument to the decoder, raised before any forward pass."""


def one_line(err: BaseException, limit: int = 200) -> str:
    """An exception as its type and the first line of its message (at most ``limit`` characters)."""
    first = (str(err).strip().splitlines() or [""])[0][:limit]
    return f"{type(err).__name__}: {first}".rstrip(": ")
