"""User-facing errors: the CLI prints their message as one clear sentence, never a traceback."""

from kvaudit.core.records import DatasetError


class KvauditError(Exception):
    """An error whose message is meant for the user as is."""


class UnsupportedModelError(KvauditError):
    """The model's architecture cannot be reused faithfully (e.g. partial rotary, sliding window)."""


USER_ERRORS = (KvauditError, DatasetError)
