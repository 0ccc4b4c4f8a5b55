"""The files ``ster chat`` reads and writes: a conversation (``/save``, ``/load``, ``--messages``) and a
text sent as a message (``/file``).

Reading reuses the bounded readers of the other commands (``cli_text.read_input_file``, as
``--prompt-file``; ``cli_template.read_messages``, as ``ster template render --messages``), so a FIFO,
a device or a huge file is refused before anything is read; writing goes through
``artifacts.atomic_outputs``, so a failed /save leaves no half-written file.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from .errors import SterError


def save_conversation(messages: list[dict], path: Path) -> None:
    """Write ``messages`` (OpenAI-shaped dicts) as a JSON array at ``path``, atomically (chat's ``/save``):
    indented, or compact when the indented form is over what ``/load`` reads.

    An earlier save of this conversation at ``path`` is replaced: a JSON array of messages that, read as ``/load``
    reads it, is a prefix of ``messages``, or of ``messages`` after their system prompt when the file has none
    (``ster chat --messages FILE --system TEXT`` continues FILE's conversation under a system prompt). Any other
    existing file is kept, including a messages list of another conversation.

    Raises:
        SterError: ``path`` is a directory or a symlink to a missing file, or exists and is not a JSON array of
            messages (each an object with a string ``role``), or holds another conversation (``continues`` is false);
            the compact JSON is larger than ``/load`` and ``--messages`` read (``MAX_INPUT_FILE_BYTES``); "cannot write
            PATH: ..." when its directory cannot take the file. Nothing is written then.
    """
    from .artifacts import atomic_outputs
    from .cli import plural  # here: cli imports cli_chat, which imports this module
    from .cli_template import MAX_INPUT_FILE_BYTES
    from .files import read_regular

    data = (json.dumps(messages, ensure_ascii=False, indent=2) + "\n").encode("utf-8")
    if len(data) > MAX_INPUT_FILE_BYTES:  # compact, as a file /load took may be: it is read back all the same
        data = (json.dumps(messages, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")
    if len(data) > MAX_INPUT_FILE_BYTES:  # a file /load would refuse: the conversation would be lost all the same
        raise SterError(f"/save {path}: the conversation is {len(data):,} bytes as JSON, over the "
                        f"{MAX_INPUT_FILE_BYTES:,} that /load and --messages read back, so nothing was written; "
                        "/reset starts a new one")
    if path.is_dir():
        raise SterError(f"/save {path}: that is a directory; give a file name (for example chat.json)")
    if os.path.lexists(path) and not path.exists():   # a dangling symlink (writing would replace the link)
        raise SterError(f"/save {path}: that is a symlink to a missing file ({os.readlink(path)}); give another "
                        "name, or remove the link")
    if os.path.lexists(path):
        try:
            doc = json.loads(read_regular(path, "conversation").decode("utf-8"))
        except (SterError, UnicodeDecodeError, ValueError, RecursionError):
            doc = None
        if not (isinstance(doc, list) and all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in doc)):
            raise SterError(f"/save {path}: that file exists and is not a saved conversation; give another name or "
                            "move that file")
        if not continues(doc, messages):
            raise SterError(f"{path} holds another conversation ({plural(len(doc), 'message')}); /save to a new "
                            "name")
    with atomic_outputs(path) as (tmp,):
        tmp.write_bytes(data)


def continues(saved: list[dict], messages: list[dict]) -> bool:
    """Whether ``messages`` continue the conversation ``saved`` (a file's messages, each a dict with a ``role``):
    ``saved``, as ``load_conversation`` normalizes it, is their beginning, or follows their system prompt when it
    has none of its own (``--system`` put one before the file's messages)."""
    from .server_request import RequestError, normalize_messages

    try:
        saved = normalize_messages(saved)   # as --messages and /load read it (text parts joined, ...)
    except (RequestError, KeyError, TypeError):  # a file they would refuse: compared as it is
        pass
    if saved == messages[:len(saved)]:
        return True
    return (bool(messages) and messages[0]["role"] == "system" and all(m["role"] != "system" for m in saved)
            and saved == messages[1:len(saved) + 1])


#: /file reads at most this many bytes, as --prompt-file does; the context refuses a long text far sooner.
MAX_MESSAGE_FILE_BYTES = 32 << 20


def read_message_file(name: str) -> str:
    """The text ``/file NAME`` sends: a UTF-8 file of at most ``MAX_MESSAGE_FILE_BYTES``, not blank, without
    its final line break ("\n" or "\r\n", as ``--prompt-file`` drops it).

    Raises:
        SterError: missing or unreadable, a directory (or a pipe, a device), too large, binary (not UTF-8,
            or holding NUL bytes), empty or only whitespace.
    """
    from .cli_text import read_input_file, without_final_newline

    if name == "-":
        raise SterError("/file -: the chat reads your messages from stdin; give a file name")
    data = read_input_file(name, "file", MAX_MESSAGE_FILE_BYTES)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SterError(f"/file {name}: not UTF-8 text (invalid byte at offset {e.start}), so a binary file or "
                        "another encoding; give a text file (convert it to UTF-8)") from None
    if "\0" in text:  # valid UTF-8, yet no text holds NUL: an image, an archive, UTF-16
        raise SterError(f"/file {name}: it holds NUL bytes, so it is a binary file (or UTF-16); give a UTF-8 "
                        "text file")
    if not text.strip():
        raise SterError(f"/file {name}: the file is {'empty' if not text else 'only whitespace'}; nothing was sent")
    return without_final_newline(text)


def load_conversation(name: str, what: str) -> list[dict]:
    """The messages in a file ``/save`` wrote (``what``: the command or option, for the messages).

    Read as ``ster template render --messages`` reads its file (``cli_template.read_messages``); ``[]``, a
    conversation saved before its first turn, is accepted.

    Raises:
        SterError: "-" (stdin holds the chat's own input), and as ``read_messages``: the file missing, too
            large, not JSON, or not a list of {role, content} messages (the first bad one named); a message
            holding a lone surrogate (JSON's unpaired ``\\udcff`` escape), which UTF-8 cannot encode, or NaN or
            Infinity (no JSON number); content the server would refuse (a part other than text, null content
            but beside an assistant's ``tool_calls``).

    Returns:
        The messages as ``server_request.normalize_messages`` gives them to a template (an assistant's null
        content beside ``tool_calls`` made "", text parts joined).
    """
    from .chat import check_surrogates
    from .cli_template import read_messages

    if name == "-":
        raise SterError(f"{what} -: the chat reads your messages from stdin; give a file name")
    from .server_request import template_messages

    messages = read_messages(name, empty_ok=True)
    for i, message in enumerate(messages):  # refused here, not by the template at the next turn or by /save
        try:
            text = json.dumps(message, ensure_ascii=False, allow_nan=False)
        except ValueError:  # NaN, Infinity: Python's json reads them, /save would write JSON no other reader takes
            raise SterError(f"{what} {name}: message {i} holds NaN or Infinity, which JSON has no number for; "
                            "give a number or a string there") from None
        check_surrogates(text, f"{name}: message {i}")
    # as the server takes a request's messages: text parts only; null content only beside tool_calls
    return template_messages(messages, f"{what} {name}")
