"""Chat messages -> prompt text.

A checkpoint's own Jinja template (tokenizer_config.json `chat_template`) is rendered in a sandbox with
the variables HF templates expect. Without one, the default format below is used:

    {bos_token}<|system|>\\n{content}\\n<|user|>\\n{content}\\n<|assistant|>\\n{content}\\n ... <|assistant|>\\n

one `<|{role}|>` header line per message, the content, a newline; the final `<|assistant|>\\n` header is
the generation prompt. The role markers are plain text, so the format works with any vocabulary.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from sglang_asym.runtime.http.errors import ApiError

CHAT_ROLES = ("system", "user", "assistant", "tool", "developer")


def normalize_messages(raw: Any) -> list[dict[str, str]]:
    """OpenAI `messages` -> [{"role", "content"}] with text content; anything else is a 400."""
    if not isinstance(raw, list) or not raw:
        raise ApiError.bad_request("messages must be a non-empty list", param="messages")
    messages = []
    for i, message in enumerate(raw):
        if not isinstance(message, dict):
            raise ApiError.bad_request(f"messages[{i}] must be an object", param="messages")
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise ApiError.bad_request(f"messages[{i}].role must be one of {list(CHAT_ROLES)}, got {role!r}",
                                       param="messages")
        messages.append({"role": role, "content": _text_content(message.get("content"), i)})
    return messages


def _text_content(content: Any, index: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ApiError.bad_request(f"messages[{index}].content: only text parts are supported, got {kind!r}",
                                           param="messages")
            parts.append(part["text"])
        return "".join(parts)
    raise ApiError.bad_request(f"messages[{index}].content must be a string or a list of text parts",
                               param="messages")


def render_default(messages: list[dict[str, str]], bos_token: str | None, add_generation_prompt: bool) -> str:
    pieces = [bos_token or ""]
    pieces += [f"<|{m['role']}|>\n{m['content']}\n" for m in messages]
    if add_generation_prompt:
        pieces.append("<|assistant|>\n")
    return "".join(pieces)


def _raise_template_error(message: str) -> None:
    raise ApiError.bad_request(f"chat template: {message}", param="messages")


@lru_cache(maxsize=4)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_template_error
    return env.from_string(template)


def render_chat(messages: list[dict[str, str]], template: str | None, bos_token: str | None,
                eos_token: str | None, add_generation_prompt: bool = True) -> str:
    if template is None:
        return render_default(messages, bos_token, add_generation_prompt)
    try:
        return _compile(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         bos_token=bos_token or "", eos_token=eos_token or "")
    except jinja2.TemplateError as exc:
        raise ApiError.bad_request(f"chat template failed: {exc}", param="messages") from exc
