"""The one exception type for bad user input.

Library code raises `InputError` with a message that says what was wrong and what to do; the CLI
prints it as one line and exits with code 2. Anything else is a bug and keeps its traceback.
"""


class InputError(ValueError):
    """Bad user input (a path, a config, an argument): one line for the user, exit code 2."""
