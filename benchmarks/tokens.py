"""Token counting: the default estimator and the exact tiktoken counter.

Samples (deterministic, built in the run): **JSON** (stored messages serialised
the way the estimator sees them), **code** (the library's own sources),
**English prose** (Python's bundled documentation topics, ``pydoc_data``) and
**Chinese prose** (sentences written for this benchmark, shuffled with a fixed
seed), plus **mixed** text interleaving all four in 4 KB blocks.

For each kind: throughput of :class:`~mimo_ctx.tokens.CharEstimator` (the default,
SPEC R2.2) and of :class:`~mimo_ctx.tokens.TiktokenCounter` (``o200k_base``) in
MB/s of UTF-8 and in exact tokens per second, and the estimator's error against
the exact count. Then the per-message cache: re-counting an unchanged message
(``estimate_message_tokens``, cached on the message) against a fresh count of the
same message.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from mimo_ctx.messages import (
    Message,
    TextPart,
    TokenUsage,
    ToolPart,
    ToolStateCompleted,
    ToolTime,
)
from mimo_ctx.tokens import CharEstimator, TiktokenCounter, estimate_message_tokens, js_json

from ._common import (
    Samples,
    Target,
    fmt_num,
    fmt_ratio,
    result,
    settle_heap,
    source_text,
    table,
    time_call,
)

__all__ = ["CHINESE_SENTENCES", "NAME", "TITLE", "run", "samples"]

NAME = "tokens"
TITLE = "Token counting: default estimator vs exact tiktoken counter"

CHINESE_SENTENCES = (
    "长时间运行的编程助手需要在有限的上下文窗口里完成很多轮工作。",
    "每一轮请求都会带上系统提示、工具列表以及之前的对话内容。",
    "当对话变得很长时，旧的工具输出会占据大量的空间。",
    "检查点文件记录了用户的原始需求、当前的任务以及已经得出的结论。",
    "重建上下文的时候，我们先读取检查点，再把最近的用户输入原样放回去。",
    "用户说过的话不能丢失，因为模型无法从别的地方重新得到这些信息。",
    "工具调用和它的结果必须成对出现，否则服务端会直接拒绝这个请求。",
    "如果估算的词元数量偏低，请求可能会在发送之后才被发现超出了限制。",
    "中文文本通常每个汉字就对应一个或更多的词元，所以按字符数除以四会明显低估。",
    "我们在后台写检查点，这样触发重建时就不需要等待太久。",
    "今天下午的会议讨论了缓存命中率和请求延迟之间的关系。",
    "测试数据是固定生成的，因此每次运行得到的数字都可以互相比较。",
    "数据库使用预写日志模式，读操作不会阻塞写操作。",
    "如果写检查点的进程失败了，系统会退回到磁盘上已有的版本。",
    "请把这个函数改成异步的，并且确保取消时不会留下未释放的锁。",
    "这个项目的目录结构比较扁平，每个模块只负责一件事情。",
    "在提交之前，请运行全部测试，并检查类型标注是否完整。",
    "服务器在本地的八千端口上监听，日志写在临时目录里。",
    "他把旧的笔记整理成了几个小文件，每个文件只讲一个主题。",
    "窗口越大，每次请求的费用就越高，响应也会变慢。",
    "观察遮蔽的方法只保留最近的十个工具结果，其余的用占位符代替。",
    "另一种做法是只保留最后二十条消息，再加上一条摘要。",
    "摘要写得太短会丢掉细节，写得太长又失去了压缩的意义。",
    "我们希望每一轮的额外开销远小于一次模型调用所花的时间。",
    "春天的时候，河边的柳树发出新芽，很多人出来散步。",
    "他一边喝茶，一边读着昨天晚上没有看完的那本小说。",
    "这家小店的面条味道很好，价格也不贵，中午总是排着长队。",
    "火车在山间穿行，窗外的风景一会儿是田野，一会儿是隧道。",
    "请在明天上午十点以前把修改后的方案发给我。",
    "孩子们在操场上踢球，老师站在一旁看着，不时提醒他们注意安全。",
)


def _chinese(size: int, seed: int = 9) -> str:
    rng = random.Random(seed)
    out: list[str] = []
    length = 0
    while length < size:
        paragraph = "".join(rng.choice(CHINESE_SENTENCES) for _ in range(rng.randint(3, 7)))
        out.append(paragraph)
        length += len(paragraph) + 1
    return "\n".join(out)


def _english(size: int) -> str:
    try:
        from pydoc_data.topics import topics
    except ImportError:  # stripped Python builds: fall back to docstring-heavy sources
        return source_text()[:size]
    text = "\n\n".join(str(topics[key]) for key in sorted(topics))
    while len(text) < size:
        text += "\n\n" + text
    return text[:size]


def _messages(count: int, *, seed: int = 0) -> list[Message]:
    code = source_text()
    out: list[Message] = []
    for i in range(count):
        start = ((i + seed) * 7919) % (len(code) - 2000)
        out.append(
            Message(
                session_id="ses_bench",
                role="assistant",
                time_created=1_700_000_000_000 + i,
                finish="tool-calls",
                usage=TokenUsage(input=1000, output=100),
                parts=[
                    TextPart(text=code[start : start + 160]),
                    ToolPart(
                        call_id=f"call_{i}",
                        tool="read",
                        state=ToolStateCompleted(
                            input={"path": f"src/m{i}.py", "offset": i},
                            output=code[start : start + 1200],
                            time=ToolTime(start=i, end=i + 1),
                        ),
                    ),
                ],
            )
        )
    return out


def _json(size: int) -> str:
    out: list[str] = []
    length = 0
    seed = 0
    while length < size:
        for message in _messages(50, seed=seed):
            for part in message.parts:
                chunk = js_json(part.model_dump(mode="json", exclude_none=True))
                out.append(chunk)
                length += len(chunk) + 1
        seed += 50
    return "\n".join(out)[:size]


def samples(size: int) -> dict[str, str]:
    """The sample texts, ``size`` characters each (deterministic)."""
    kinds = {
        "JSON": _json(size),
        "code": source_text()[:size],
        "English prose": _english(size),
        "Chinese prose": _chinese(size),
    }
    block = 4096
    mixed: list[str] = []
    for start in range(0, size, block):
        for text in kinds.values():
            mixed.append(text[start : start + block])
    kinds["mixed"] = "".join(mixed)[:size]
    return kinds


def _fresh_copies(messages: list[Message]) -> list[Message]:
    return [Message.model_validate(m.model_dump()) for m in messages]


def _cache(count: int, repeats: int) -> tuple[Samples, Samples]:
    """Per-message seconds: a fresh count of each message, and a cached re-count."""
    base = _messages(count)
    fresh_values: list[float] = []
    cached_values: list[float] = []
    for _ in range(repeats):
        messages = _fresh_copies(base)
        fresh = time_call(lambda ms=messages: [estimate_message_tokens(m) for m in ms], 1)
        cached = time_call(lambda ms=messages: [estimate_message_tokens(m) for m in ms], 1)
        fresh_values.append(fresh.values[0] / count)
        cached_values.append(cached.values[0] / count)
    return Samples(tuple(fresh_values)), Samples(tuple(cached_values))


def run(*, quick: bool = False) -> dict[str, Any]:
    """Run the token-counting benchmark (``quick``: small samples, few repeats)."""
    size = 20_000 if quick else 1_000_000
    repeats = 2 if quick else 5
    setup = time.perf_counter()
    exact = TiktokenCounter("o200k_base")
    encoding_seconds = time.perf_counter() - setup
    estimator = CharEstimator()
    texts = samples(size)
    settle_heap()

    rows: list[list[str]] = []
    data: dict[str, Any] = {"size_chars": size, "encoding_load_seconds": encoding_seconds}
    mixed_rate = 0.0
    for kind, text in texts.items():
        mb = len(text.encode("utf-8")) / 1e6
        tokens = exact.count(text)
        estimated = estimator.count(text)
        timings: dict[str, Samples] = {}
        for name, count in (("estimator", estimator.count), ("exact", exact.count)):
            fn: Callable[[], int] = lambda c=count, t=text: c(t)  # noqa: E731
            timings[name] = time_call(fn, repeats)
        error = (estimated - tokens) / tokens
        est_t, exact_t = timings["estimator"].median, timings["exact"].median
        if kind == "mixed":
            mixed_rate = tokens / exact_t
        rows.append(
            [
                kind,
                f"{mb:.2f} MB",
                fmt_num(tokens),
                f"{mb / est_t:,.0f} MB/s",
                f"{tokens / est_t / 1e6:,.0f} M/s",
                f"{mb / exact_t:.1f} MB/s",
                f"{tokens / exact_t / 1e6:.2f} M/s",
                f"{error:+.0%}",
            ]
        )
        data[kind] = {
            "bytes_mb": mb,
            "exact_tokens": tokens,
            "estimated_tokens": estimated,
            "estimator_error": error,
            "estimator": timings["estimator"].to_json(),
            "exact": timings["exact"].to_json(),
        }

    fresh, cached = _cache(200 if not quick else 20, repeats)
    cache_ratio = fresh.median / cached.median
    data["cache"] = {
        "fresh_us": fresh.median * 1e6,
        "cached_us": cached.median * 1e6,
        "ratio": cache_ratio,
    }
    throughput = table(
        f"Throughput (median of {repeats}; exact = o200k_base; tokens/s in exact tokens)",
        [
            "text",
            "size",
            "exact tokens",
            "estimator MB/s",
            "estimator tok/s",
            "exact MB/s",
            "exact tok/s",
            "estimator error",
        ],
        rows,
    )
    cache = table(
        "Per-message count (a tool round of ~1.5k characters; median per message)",
        ["count", "time", "ratio"],
        [
            ["fresh (JSON of every part, /4)", f"{fresh.median * 1e6:.2f} µs", ""],
            [
                "cached re-count (unchanged message)",
                f"{cached.median * 1e6:.3f} µs",
                fmt_ratio(cache_ratio),
            ],
        ],
    )
    targets = [
        Target(
            "exact counter on mixed text",
            "≥ 1M tokens/s",
            f"{mixed_rate / 1e6:.2f}M tokens/s",
            mixed_rate >= 1e6,
            ratio=mixed_rate / 1e6,
        ),
        Target(
            "cached re-count vs fresh count",
            "≥ 100× faster",
            fmt_ratio(cache_ratio),
            cache_ratio >= 100,
            ratio=cache_ratio,
        ),
    ]
    notes = [
        f"Building the o200k_base encoding from the bundled rank files took "
        f"{encoding_seconds * 1000:.0f} ms (once per process, at start-up; not in the figures).",
        "Estimator error = (chars/4 estimate - exact) / exact: negative means the default "
        "under-counts (SPEC R2.2 is the original's rule; TiktokenCounter is the exact option).",
    ]
    return result(NAME, TITLE, tables=[throughput, cache], targets=targets, notes=notes, data=data)
