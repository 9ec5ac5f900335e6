"""The one exception type users see as a one-line message (the CLI prints it and exits non-zero)."""


class BertTasksError(Exception):
    """A mistake in the user's input: bad file, bad config, bad model dir.

    The message is one line saying what is wrong, where, and what to do. The CLI prints it without a
    traceback (unless --debug); library users can catch it.
    """
