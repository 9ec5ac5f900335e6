"""The one exception type users see as a one-line message (the CLI prints it and exits non-zero)."""


class BertTasksError(Exception):
    """A mistake in the user's input: bad file, bad config, bad model dir.

    The message is one line saying what is wrong, where, and what to do. The CLI prints it without a
    traceback (unless --debug); library users can catch it.
    """


def listed(names: list[str], shown: int = 10) -> str:
    """The first `shown` names and how many there are in all: a message stays one line for 1,000 labels."""
    if len(names) <= shown:
        return ", ".join(names)
    return f"{', '.join(names[:shown])}, ... ({len(names)} in all)"
