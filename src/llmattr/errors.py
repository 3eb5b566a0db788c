"""The one exception type users can cause, and warnings recorded on results."""


class LlmattrError(ValueError):
    """A mistake the user can fix (bad path, empty text, unknown method, pi outside (0,1), ...).

    The message is one line that says what to do; the CLI prints it and exits with status 2.
    """


class NotExplainedWarning(UserWarning):
    """Some items of a batch were not explained (the others were kept): ``llmattr.explain`` names them, and the CLI,
    whose own error line names them too, filters this category out."""
