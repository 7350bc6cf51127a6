"""Provider adapters: converters, the payload validator and the client wrappers.

The converters themselves live in :mod:`mimo_ctx.providers.openai` (Chat
Completions and Responses) and :mod:`mimo_ctx.providers.anthropic` (Messages);
:mod:`mimo_ctx.providers.validate` checks a finished payload against the
provider's rules. All of them work on plain ``dict`` payloads, the JSON the
providers accept, and import no SDK: an SDK's typed params are ``TypedDict``
views of the same dicts, so a payload built here can be passed to the SDK as it
is, and an SDK object turns into such a dict with ``model_dump()``.

Every ``to_*`` converter first applies :func:`mimo_ctx.view.apply_send_rules`,
so what is sent follows SPEC A10 whatever the provider. Every ``from_*``
converter builds its messages with the converter kit (:mod:`mimo_ctx.convert`,
re-exported here): fresh ascending ids (made for ``time_ms`` when given, so they
sort at that time), tool results joined into the calling
:class:`~mimo_ctx.messages.ToolPart` where they can be, the kit's rules for
tool call arguments and for the non-text content of tool results.

Client wrappers: :func:`wrap_openai` and :func:`wrap_anthropic` (and
:func:`validate_request`) are exported lazily, so importing this package needs
no SDK and does not load the middleware.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Final

from mimo_ctx.convert import (
    BOUNDARY_TEXT_SEPARATOR,
    RAW_ARGUMENTS_KEY,
    DataUrl,
    MessageDraft,
    ToolCallJoiner,
    ToolOutcome,
    build_messages,
    decode_arguments,
    encode_arguments,
    file_mention,
    guess_mime,
    json_list,
    json_object,
    make_data_url,
    opt_object,
    parse_data_url,
    tool_outcome,
    tool_result_content,
)

if TYPE_CHECKING:
    from mimo_ctx.providers.anthropic_client import wrap_anthropic
    from mimo_ctx.providers.openai_client import wrap_openai
    from mimo_ctx.providers.validate import validate_request

__all__ = [
    "BOUNDARY_TEXT_SEPARATOR",
    "RAW_ARGUMENTS_KEY",
    "DataUrl",
    "MessageDraft",
    "ToolCallJoiner",
    "ToolOutcome",
    "build_messages",
    "decode_arguments",
    "encode_arguments",
    "file_mention",
    "guess_mime",
    "json_list",
    "json_object",
    "make_data_url",
    "opt_object",
    "parse_data_url",
    "tool_outcome",
    "tool_result_content",
    "validate_request",
    "wrap_anthropic",
    "wrap_openai",
]

_LAZY: Final = {
    "wrap_openai": "mimo_ctx.providers.openai_client",
    "wrap_anthropic": "mimo_ctx.providers.anthropic_client",
    "validate_request": "mimo_ctx.providers.validate",
}


def __getattr__(name: str) -> Any:
    # Lazy exports (PEP 562): the wrappers import the middleware, and the SDKs only
    # when called, so ``import mimo_ctx.providers`` stays light and SDK-free.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
