"""The exception types the CLI tells apart: bad user input (one line, exit status 2) and a broken
invariant of the simulator itself (a bug: reported as an internal error, exit status 1)."""


class InputError(Exception):
    """Bad input (config field, trace line, impossible deployment); the message names the place."""


class InvariantError(RuntimeError):
    """The simulator broke one of its own rules (a request ended twice, memory over capacity...):
    the run's numbers cannot be trusted, so it stops rather than report them."""
