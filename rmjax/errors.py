"""Errors that name the problem and the fix."""


class RmjaxError(Exception):
    """Base class of rmjax's user-facing errors."""


class UnsupportedModelError(RmjaxError):
    """The checkpoint's architecture or a config option is outside what rmjax implements."""


class CheckpointError(RmjaxError):
    """A checkpoint folder or file is incomplete or inconsistent."""


class TokenizerMismatchError(RmjaxError):
    """The tokenizer does not fit the model's embedding table."""


class PromptTooLongError(RmjaxError):
    """A prompt does not fit in the model's context."""
