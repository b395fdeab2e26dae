"""A checkpoint's chat template (Hugging Face's Jinja templates in `tokenizer_config.json` or
`chat_template.jinja`: Qwen, LFM2, Granite ...), cut into the turn pieces that
`ssmport.runtime.chat.ChatSession` appends.

ChatSession keeps the conversation as the tokens it fed: the first prompt, each reply as
generated, then the next user turn. So the template is rendered once, on placeholder
messages, and cut into those pieces:

    render([user U1], generation prompt)                      -> first turn: "...U1...<gen prompt>"
    render([user U1, assistant R, user U2], generation prompt) -> after R: "<turn end>...U2...<gen prompt>"

The reply ends at the template's turn-end token (the special token that follows R, e.g.
<|im_end|>) or at the tokenizer's eos_token; neither is fed, and the next turn's text starts
with the turn end, as the template writes it. A template that rewrites earlier turns (Qwen3's
drops past <think> blocks) is followed for the new turn only: the state keeps what was said.

Rendering follows transformers' settings: a sandboxed Jinja environment with trim_blocks and
lstrip_blocks, the loopcontrols extension, `tojson`, `raise_exception` and `strftime_now`.
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from ssmport.errors import SsmportError

CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"  # where newer checkpoints keep the template instead
_USER_1, _REPLY, _USER_2 = "ssmportUserTurnOne", "ssmportAssistantReply", "ssmportUserTurnTwo"
# The placeholder conversations the template is cut from: one user turn; user, reply, user.
_CONVERSATIONS = ([{"role": "user", "content": _USER_1}],
                  [{"role": "user", "content": _USER_1}, {"role": "assistant", "content": _REPLY},
                   {"role": "user", "content": _USER_2}])  # fmt: skip
_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


def token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json spells it: a string or an AddedToken object."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def read_template(folder: Path) -> tuple[str, dict, Path] | None:
    """(template source, tokenizer_config, file it came from) from a folder holding a
    tokenizer_config.json and/or a chat_template.jinja, or None when neither has a template."""
    config_path, template_path = folder / CONFIG_FILE, folder / TEMPLATE_FILE
    config = _read_config(config_path) if config_path.is_file() else {}
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
        template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"), None)
    if isinstance(template, str):
        return template, config, config_path
    if template_path.is_file():
        try:
            return template_path.read_text(encoding="utf-8"), config, template_path
        except (OSError, UnicodeDecodeError) as exc:
            raise SsmportError(f"{template_path}: unreadable chat template ({exc})") from None
    return None


def _read_config(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SsmportError(f"{path}: not a readable tokenizer_config.json ({exc})") from None
    if not isinstance(data, dict):
        raise SsmportError(f"{path}: tokenizer_config.json is not a JSON object")
    return data


# A template comes from a checkpoint or a bundle, not from the user: its work is bounded.
MAX_TEMPLATE_SECONDS = 5.0
MAX_TEMPLATE_CHARS = 1 << 20  # a rendered turn, and any string or list the template builds


def render(source: str, messages: list[dict], config: dict, where: str) -> str:
    """The template rendered as transformers renders it, with add_generation_prompt, within
    MAX_TEMPLATE_SECONDS and MAX_TEMPLATE_CHARS; any failure is one line naming `where`."""
    def raise_exception(message):
        raise _Refusal(message)

    env = _environment()
    env.globals.update(raise_exception=raise_exception)
    specials = {k: token_text(config.get(k)) for k in _SPECIAL_KEYS if token_text(config.get(k)) is not None}
    try:
        with _time_limit(MAX_TEMPLATE_SECONDS):
            pieces, size = [], 0
            for piece in env.from_string(source).generate(messages=messages, add_generation_prompt=True, **specials):
                size += len(piece)
                if size > MAX_TEMPLATE_CHARS:
                    raise _TooBig(f"it writes more than {MAX_TEMPLATE_CHARS:,} characters")
                pieces.append(piece)
            return "".join(pieces)
    except _Refusal as exc:
        raise TemplateRefusal(f"{where}: the chat template does not render (TemplateError: {exc})") from None
    except Exception as exc:  # noqa: BLE001 (a template can fail any way: {% include %}, recursion, overflow)
        raise SsmportError(f"{where}: the chat template does not render ({type(exc).__name__}: {exc})") from None


class _TooBig(Exception):
    pass


class _Refusal(Exception):
    """The template's own raise_exception(...)."""


class TemplateRefusal(SsmportError):
    """A template that rendered until its own raise_exception refused the messages."""


def check_renders(folder: Path) -> None:
    """Refuse a chat template in `folder` that cannot render (an {% include %}, unbounded work,
    recursion: what `ssmport chat` would refuse) before it is exported, by rendering a
    conversation of placeholder messages as chat does. A template whose own raise_exception
    refuses those messages passes: a real one may insist on a system turn or on roles ssmport's
    placeholders lack, and chat names that refusal itself."""
    found = read_template(folder)
    if found is None:
        return
    source, config, path = found
    with contextlib.suppress(TemplateRefusal):
        for messages in _CONVERSATIONS:
            render(source, messages, config, str(path))


def _environment():
    """transformers' settings, in a sandbox whose `*` and `**` refuse results too large to build
    (`'x' * 4000000000` took 23 s and 4 GB before failing)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Bounded(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**"})

        def call_binop(self, context, operator, left, right):
            if operator == "**" and isinstance(right, int | float) and abs(right) > 256:
                raise _TooBig(f"{left!r:.20} ** {right!r:.20} is too large")
            if operator == "*" and isinstance(right, int) and isinstance(left, str | list | tuple):
                left, right = right, left
            if operator == "*" and isinstance(left, int) and isinstance(right, str | list | tuple):
                if left * len(right) > MAX_TEMPLATE_CHARS:
                    raise _TooBig(f"a repetition of {left:,} x {len(right):,} is too large")
            return super().call_binop(context, operator, left, right)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = Bounded(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals.update(strftime_now=lambda f: datetime.now().strftime(f))
    return env


@contextlib.contextmanager
def _time_limit(seconds: float):
    """Raise TimeoutError in the block after `seconds` (SIGALRM; only in the main thread, where
    the CLI renders). A timer already armed (a caller's) is re-armed with what it had left."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum, frame):
        raise TimeoutError(f"it ran for more than {seconds:g} s")

    start = time.monotonic()
    previous = signal.signal(signal.SIGALRM, expired)
    outer, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - start), 0.001))


def turn_pieces(source: str, config: dict, where: str) -> tuple[str, str]:
    """(first user turn, later user turn), "{message}" standing for the user's text; the later
    one begins right after the previous reply (with its turn end)."""
    first, two = (render(source, messages, config, where) for messages in _CONVERSATIONS)
    if first.count(_USER_1) != 1 or [two.count(s) for s in (_USER_1, _REPLY, _USER_2)] != [1, 1, 1] or not (
        two.index(_USER_1) < two.index(_REPLY) < two.index(_USER_2)
    ):
        raise SsmportError(f"{where}: the chat template does not write each message once, in order; "
                           "ssmport cannot tell its turns apart")  # fmt: skip
    return first.replace(_USER_1, "{message}"), two[two.index(_REPLY) + len(_REPLY) :].replace(_USER_2, "{message}")


def chat_turns(folder: Path, tokenizer) -> tuple[str, str, tuple[int, ...]]:
    """(first user turn, later user turn, stop ids) of the template in a tokenizer folder (a
    bundle's tokenizer/, a checkpoint folder). The stop ids are the template's turn-end token,
    the tokenizer_config's eos_token and the tokenizer's own end-of-text."""
    found = read_template(folder)
    if found is None:
        raise SsmportError(f"{folder}: no chat template ({CONFIG_FILE} has no 'chat_template', no {TEMPLATE_FILE})")
    source, config, path = found
    first, later = turn_pieces(source, config, str(path))
    head = tokenizer.encode(later.split("{message}")[0])
    if not head or tokenizer.token_bytes(head[0]) is not None:
        raise SsmportError(f"{path}: the chat template does not end a reply with a special token, so ssmport "
                           "cannot tell where a reply ends")  # fmt: skip
    stops = {head[0], *tokenizer.eos_ids}
    eos = token_text(config.get("eos_token"))
    if eos is not None:
        ids = tokenizer.encode(eos)
        if len(ids) == 1 and tokenizer.token_bytes(ids[0]) is None:
            stops.add(ids[0])
    return first, later, tuple(sorted(stops))
