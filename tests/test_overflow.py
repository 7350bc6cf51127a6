"""Overflow recognition from each provider's real error shape (SPEC R1.5, A11)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx2
import openai
import pytest

from mimo_ctx.overflow import (
    OVERFLOW_PATTERNS,
    is_context_overflow,
    is_overflow_stream_event,
    register_overflow_recognizer,
    unregister_overflow_recognizer,
)

# One realistic message per A11 fragment, as the provider words it.
PROVIDER_MESSAGES: dict[str, str] = {
    "anthropic": "prompt is too long: 208310 tokens > 200000 maximum",
    "bedrock": "Input is too long for requested model.",
    "openai": "Your input exceeds the context window of this model. Please adjust your input "
    "and try again.",
    "gemini": "The input token count (1196265) exceeds the maximum number of tokens allowed "
    "(1048575).",
    "xai": "This model's maximum prompt length is 131072 but the request contains 153098 tokens.",
    "groq": "Please reduce the length of the messages or completion.",
    "openrouter": "This endpoint's maximum context length is 200000 tokens. However, you "
    "requested about 234567 tokens (230000 of text input, 4567 of tool input). Please reduce "
    'the length of either one, or use the "middle-out" transform to compress your prompt '
    "automatically.",
    "copilot": "prompt token count of 135019 exceeds the limit of 128000",
    "llama.cpp": "the request exceeds the available context size, try increasing it",
    "lmstudio": "The number of tokens to keep from the initial prompt is greater than the "
    "context length. Try to load the model with a larger context length, or provide a "
    "shorter input",
    "minimax": "invalid params, context window exceeds limit (2013)",
    "kimi": "Invalid request: Your request exceeded model token limit: 262144 (requested: 301020)",
    "generic": "Error: Context length exceeded for this conversation",
    "http-413": "413 Request Entity Too Large",
    "vllm-only": "This model's context length is only 8192 tokens; the prompt has 9000.",
    "vllm-input": "Input length (9000) exceeds model's maximum context length (8192).",
    "ollama": "prompt too long; exceeded max context length by 1024 tokens",
    "mistral": "Prompt contains 40000 tokens and 0 draft tokens, too large for model with 32768 "
    "maximum context length",
    "zai": "model_context_window_exceeded",
}


def test_a11_every_fragment_has_a_pattern() -> None:
    """Each A11 fragment is compiled once, case-insensitively."""
    assert len(OVERFLOW_PATTERNS) == 19
    assert all(p.flags & re.IGNORECASE for p in OVERFLOW_PATTERNS)


@pytest.mark.parametrize("provider", sorted(PROVIDER_MESSAGES))
def test_a11_each_provider_message_is_an_overflow(provider: str) -> None:
    message = PROVIDER_MESSAGES[provider]
    assert is_context_overflow(message)
    assert is_context_overflow(message.upper())  # case-insensitive
    assert is_context_overflow({"error": {"message": message, "type": "invalid_request_error"}})


def test_a11_every_pattern_is_exercised() -> None:
    """No pattern is dead weight: each matches at least one realistic message."""
    for pattern in OVERFLOW_PATTERNS:
        assert any(pattern.search(m) for m in PROVIDER_MESSAGES.values()), pattern.pattern


def _response(status: int, url: str, body: Any) -> httpx2.Response:
    return httpx2.Response(status, request=httpx2.Request("POST", url), json=body)


def _openai_error(cls: type[openai.APIStatusError], status: int, error: dict[str, Any]) -> Any:
    # The SDK hands the inner "error" object to the exception as its body.
    response = _response(status, "https://api.openai.com/v1/chat/completions", {"error": error})
    return cls(f"Error code: {status} - {{'error': {error}}}", response=response, body=error)


def _anthropic_error(
    cls: type[anthropic.APIStatusError], status: int, error: dict[str, Any]
) -> Any:
    body = {"type": "error", "error": error}
    response = _response(status, "https://api.anthropic.com/v1/messages", body)
    return cls(f"Error code: {status} - {body}", response=response, body=body)


def test_r1_5_openai_sdk_error_with_code() -> None:
    exc = _openai_error(
        openai.BadRequestError,
        400,
        {
            "message": "This model's maximum context length is 128000 tokens. However, your "
            "messages resulted in 130512 tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        },
    )
    assert is_context_overflow(exc)


def test_r1_5_code_alone_is_enough() -> None:
    """An error code is recognised even when the message is worded differently."""
    exc = _openai_error(
        openai.BadRequestError,
        400,
        {
            "message": "Too much input.",
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
        },
    )
    assert is_context_overflow(exc)
    assert is_context_overflow({"error": {"code": "model_context_window_exceeded", "message": "x"}})
    assert is_context_overflow({"type": "context_length_exceeded"})


def test_r1_5_anthropic_sdk_error() -> None:
    exc = _anthropic_error(
        anthropic.BadRequestError,
        400,
        {"type": "invalid_request_error", "message": PROVIDER_MESSAGES["anthropic"]},
    )
    assert is_context_overflow(exc)


def test_r1_5_http_413_alone_is_an_overflow() -> None:
    exc = _anthropic_error(
        anthropic.APIStatusError,
        413,
        {
            "type": "request_too_large",
            "message": "Request exceeds the maximum allowed number of bytes.",
        },
    )
    assert is_context_overflow(exc)

    class Plain(Exception):
        status = "413"

    assert is_context_overflow(Plain("whatever"))


def test_r1_5_status_from_response_attribute() -> None:
    class Response:
        status_code = 413

    class Wrapped(Exception):
        response = Response()

    assert is_context_overflow(Wrapped("proxy said no"))


def test_r1_5_wrapped_exception_chain_is_followed() -> None:
    """pydantic-ai / LangChain wrap the SDK error; the cause still counts."""
    inner = _anthropic_error(
        anthropic.BadRequestError,
        400,
        {"type": "invalid_request_error", "message": PROVIDER_MESSAGES["anthropic"]},
    )
    outer = RuntimeError("model request failed")
    outer.__cause__ = inner
    assert is_context_overflow(outer)
    context_only = RuntimeError("during handling")
    context_only.__context__ = inner
    assert is_context_overflow(context_only)


def test_r1_5_body_as_bytes_and_nested_lists() -> None:
    class HttpError(Exception):
        body = b'{"detail": [{"msg": "prompt too long; exceeded context length by 3 tokens"}]}'

    assert is_context_overflow(HttpError())
    assert is_context_overflow({"errors": [{"detail": {"msg": PROVIDER_MESSAGES["ollama"]}}]})


@pytest.mark.parametrize(
    ("cls", "status", "error"),
    [
        (
            openai.RateLimitError,
            429,
            {
                "message": "Rate limit reached for gpt-4o in organization org-abc on tokens per "
                "min (TPM): Limit 30000, Used 29000, Requested 5000. Please try again in 8s.",
                "type": "tokens",
                "code": "rate_limit_exceeded",
            },
        ),
        (
            openai.AuthenticationError,
            401,
            {
                "message": "Incorrect API key provided: sk-abc. You can find your API key at "
                "https://platform.openai.com/account/api-keys.",
                "type": "invalid_request_error",
                "code": "invalid_api_key",
            },
        ),
        (
            openai.BadRequestError,
            400,
            {
                "message": "Invalid schema for function 'read': In context=(), 'required' is "
                "required to be supplied and to be an array.",
                "type": "invalid_request_error",
                "param": "tools[0].function.parameters",
                "code": "invalid_function_parameters",
            },
        ),
        (
            openai.InternalServerError,
            500,
            {
                "message": "The server had an error while processing your request.",
                "type": "server_error",
            },
        ),
    ],
)
def test_r1_5_openai_negatives(
    cls: type[openai.APIStatusError], status: int, error: dict[str, Any]
) -> None:
    assert not is_context_overflow(_openai_error(cls, status, error))


@pytest.mark.parametrize(
    ("cls", "status", "error"),
    [
        (
            anthropic.RateLimitError,
            429,
            {
                "type": "rate_limit_error",
                "message": "This request would exceed the rate limit for your organization of "
                "40,000 input tokens per minute.",
            },
        ),
        (
            anthropic.AuthenticationError,
            401,
            {"type": "authentication_error", "message": "invalid x-api-key"},
        ),
        (
            anthropic.BadRequestError,
            400,
            {
                "type": "invalid_request_error",
                "message": "tools.0.custom.input_schema: JSON schema is invalid",
            },
        ),
        (
            anthropic.InternalServerError,
            500,
            {"type": "api_error", "message": "Internal server error"},
        ),
        (anthropic.APIStatusError, 529, {"type": "overloaded_error", "message": "Overloaded"}),
    ],
)
def test_r1_5_anthropic_negatives(
    cls: type[anthropic.APIStatusError], status: int, error: dict[str, Any]
) -> None:
    assert not is_context_overflow(_anthropic_error(cls, status, error))


def test_r1_5_rate_limit_is_never_an_overflow_whatever_its_text() -> None:
    """Our choice: 429 vetoes an overflow reading (a rebuild does not fix a rate limit)."""
    exc = _openai_error(
        openai.RateLimitError,
        429,
        {"message": "Request too large. Please reduce the length of the messages.", "code": None},
    )
    assert not is_context_overflow(exc)


def test_r1_5_plain_negatives() -> None:
    assert not is_context_overflow("Connection reset by peer")
    assert not is_context_overflow({"error": {"message": "invalid tool schema", "code": 400}})
    assert not is_context_overflow(ValueError("bad value"))
    assert not is_context_overflow({})


@pytest.fixture
def recognizers() -> Iterator[list[Any]]:
    added: list[Any] = []
    yield added
    for fn in added:
        unregister_overflow_recognizer(fn)


def test_r1_5_registered_recognizer_extends_and_can_veto(recognizers: list[Any]) -> None:
    class VendorError(Exception):
        def __init__(self, reason: str) -> None:
            super().__init__("vendor failure")
            self.reason = reason

    def vendor(error: object) -> bool | None:
        if isinstance(error, VendorError):
            return error.reason == "CTX_FULL"
        return None

    recognizers.append(register_overflow_recognizer(vendor))
    assert is_context_overflow(VendorError("CTX_FULL"))
    assert not is_context_overflow(VendorError("OTHER"))
    assert is_context_overflow(PROVIDER_MESSAGES["anthropic"])  # no opinion: built-ins decide

    def veto(error: object) -> bool | None:
        return False if error == "prompt is too long (test veto)" else None

    recognizers.append(register_overflow_recognizer(veto))
    assert not is_context_overflow("prompt is too long (test veto)")
    register_overflow_recognizer(veto)  # idempotent
    unregister_overflow_recognizer(veto)
    assert is_context_overflow("prompt is too long (test veto)")


# --------------------------------------------------------------------------- streams


def test_a11_anthropic_stream_error_event() -> None:
    event = {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": PROVIDER_MESSAGES["anthropic"]},
    }
    assert is_overflow_stream_event(event)
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    assert not is_overflow_stream_event(overloaded)


def test_a11_openai_responses_stream_events() -> None:
    error_event = {
        "type": "error",
        "code": "context_length_exceeded",
        "message": PROVIDER_MESSAGES["openai"],
        "param": None,
        "sequence_number": 3,
    }
    failed = {
        "type": "response.failed",
        "sequence_number": 9,
        "response": {
            "id": "resp_1",
            "status": "failed",
            "error": {"code": "context_length_exceeded", "message": PROVIDER_MESSAGES["openai"]},
        },
    }
    failed_other = {
        "type": "response.failed",
        "response": {"error": {"code": "server_error", "message": "Something went wrong."}},
    }
    assert is_overflow_stream_event(error_event)
    assert is_overflow_stream_event(failed)
    assert not is_overflow_stream_event(failed_other)


def test_a11_openai_compatible_error_chunk_and_zai_finish_reason() -> None:
    chunk = {"id": "gen-1", "error": {"code": 400, "message": PROVIDER_MESSAGES["openrouter"]}}
    zai: dict[str, Any] = {
        "id": "c",
        "choices": [{"index": 0, "delta": {}, "finish_reason": "model_context_window_exceeded"}],
    }
    assert is_overflow_stream_event(chunk)
    assert is_overflow_stream_event(zai)


def test_a11_generated_text_is_never_read_as_an_error() -> None:
    """A model writing the words "prompt is too long" is not an overflow."""
    delta = {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "text_delta", "text": "Anthropic says: prompt is too long"},
    }
    chat = {
        "choices": [
            {"delta": {"content": "maximum context length is 8 tokens"}, "finish_reason": None}
        ]
    }
    assert not is_overflow_stream_event(delta)
    assert not is_overflow_stream_event(chat)
    assert not is_overflow_stream_event(
        {"type": "response.output_text.delta", "delta": "context_length_exceeded"}
    )
    assert not is_overflow_stream_event("prompt is too long")
    assert not is_overflow_stream_event(None)


def test_a11_sdk_event_objects_are_read_with_model_dump() -> None:
    from openai.types.responses import ResponseErrorEvent

    event = ResponseErrorEvent(
        type="error",
        code="context_length_exceeded",
        message=PROVIDER_MESSAGES["openai"],
        param=None,
        sequence_number=1,
    )
    assert is_overflow_stream_event(event)
    other = ResponseErrorEvent(
        type="error", code="server_error", message="oops", param=None, sequence_number=2
    )
    assert not is_overflow_stream_event(other)
