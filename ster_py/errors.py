"""The one error type of ster-py (``SterError``) and its subclasses (``ContextFull``, ``TemplateError``); ``Cancelled``, which
is not an error (a forward pass stopped on request); and how a message shows text ster did not write
(``terminal_text``)."""

#: Longest error message kept whole (characters). A message quoting a value read from a
#: hostile file (a 10 M-character ``model_type``) keeps its head and tail around a marker.
MAX_MESSAGE_CHARS = 2000


class SterError(Exception):
    """An error a user can act on.

    The message says what went wrong and, where there is one, what to do about
    it. The CLI prints it without a traceback and exits with status 1 (status 2
    for command-line usage errors, as Typer does). A message longer than
    ``MAX_MESSAGE_CHARS`` (it echoes an unbounded value) is cut in the middle.
    """

    def __init__(self, message="", *args):
        if isinstance(message, str) and len(message) > MAX_MESSAGE_CHARS:
            head, tail = MAX_MESSAGE_CHARS * 2 // 3, MAX_MESSAGE_CHARS // 4
            message = (f"{message[:head]} [... {len(message) - head - tail} characters cut ...] "
                       f"{message[-tail:]}")
        super().__init__(message, *args)


class ContextFull(SterError):
    """A prompt longer than the context holds (``generate.generate``, ``prompt.refuse_if_too_long``).

    Its own type because what to do depends on who built the prompt: a command's user shortens
    the prompt they gave, while ``ster chat``'s user never wrote the prompt (the history is in it)
    and is told to ``/reset`` instead.
    """


class TemplateError(SterError):
    """A chat template failed on a conversation (``chat.render_chat``). The message names the template's
    source (a model's path) and advises its author; ``problem`` is what went wrong alone and ``line`` the
    template line (or None), for callers whose user can only change the conversation (``ster chat``'s
    ``/load``)."""

    def __init__(self, message: str, problem: str, line: "int | None" = None):
        super().__init__(message)
        self.problem, self.line = problem, line


class Cancelled(Exception):
    """A forward call stopped between layers because its ``cancelled`` callback said so (a chat's
    Ctrl-C or a server client gone during a long prompt's prefill). Not an error: ``PromptCache.prefill``
    leaves its cache consistent and ``generate`` ends the run with stop_reason "cancelled"."""


def terminal_text(text: str, keep: str = "") -> str:
    """``text`` with every character a terminal would act on rather than show (ESC, BEL, the other control
    and format characters, a lone surrogate) written as its Python escape (``\\x1b``); those in ``keep`` stay.

    For text ster did not write (a path or a command typed or piped into chat, a name read from a file)
    before it is printed: an escape sequence in it would otherwise clear or retitle the terminal.
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in keep else repr(c)[1:-1] for c in text)
