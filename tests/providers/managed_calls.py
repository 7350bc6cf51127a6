"""Every managed way in, called as a host calls it, for the tests of all five.

Each call takes a client (wrapped or bare) and the host's list, and returns the
answer's text; ``WAYS`` names them with the provider whose fake server answers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["WAYS", "Call"]

Call = Callable[[Any, list[Any]], Awaitable[str]]


async def _chat(client: Any, host: list[Any]) -> str:
    reply = await client.chat.completions.create(model="gpt-test", messages=host)
    return str(reply.choices[0].message.content)


async def _chat_stream(client: Any, host: list[Any]) -> str:
    stream = await client.chat.completions.create(model="gpt-test", messages=host, stream=True)
    text = ""
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    return text


async def _responses(client: Any, host: list[Any]) -> str:
    reply = await client.responses.create(model="gpt-test", input=host)
    return str(reply.output_text)


async def _messages(client: Any, host: list[Any]) -> str:
    reply = await client.messages.create(model="claude-test", max_tokens=64, messages=host)
    return str(reply.content[0].text)


async def _messages_stream(client: Any, host: list[Any]) -> str:
    async with client.messages.stream(model="claude-test", max_tokens=64, messages=host) as stream:
        async for _ in stream.text_stream:
            pass
        final = await stream.get_final_message()
    return str(final.content[0].text)


WAYS: dict[str, tuple[str, Call]] = {
    "chat": ("openai", _chat),
    "chat stream": ("openai", _chat_stream),
    "responses": ("openai", _responses),
    "messages": ("anthropic", _messages),
    "messages.stream": ("anthropic", _messages_stream),
}
