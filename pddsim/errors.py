"""The one exception type for bad user input: the CLI turns it into one line and exit status 2."""


class InputError(Exception):
    """Bad input (config field, trace line, impossible deployment); the message names the place."""
