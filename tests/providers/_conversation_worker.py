"""One worker of tests/providers/test_wrap_conversations.py: a wrapped OpenAI client in its
own OS process, serving the turns it is handed.

Usage: ``python _conversation_worker.py STORE BASE_URL SESSION_ID MEMORY_ROOT`` where
STORE is ``sqlite:<path>`` or ``pg:<schema>`` (the DSN in ``MIMO_CTX_PG_DSN``). Each
line on stdin is a JSON request ``{"messages": [...]}``; the worker answers each with
one JSON line: ``{"message": <the assistant message>}`` or ``{"error": "<type>: <text>"}``.
"""

from __future__ import annotations

import json
import os
import sys

import anyio
import openai
from openai.types.chat import ChatCompletionToolParam

from mimo_ctx.middleware import ContextMiddleware
from mimo_ctx.providers import wrap_openai
from mimo_ctx.store import SQLiteStore, Store
from mimo_ctx.triggers import ModelLimits

TOOLS: list[ChatCompletionToolParam] = [
    {
        "type": "function",
        "function": {"name": "read", "parameters": {"type": "object", "properties": {}}},
    }
]


async def _store(spec: str) -> Store:
    kind, _, where = spec.partition(":")
    if kind == "sqlite":
        return await SQLiteStore.open(where)
    from mimo_ctx.store.postgres import PostgresStore

    return await PostgresStore.open(os.environ["MIMO_CTX_PG_DSN"], schema=where, create_schema=True)


async def main(spec: str, base_url: str, session_id: str, memory_root: str) -> None:
    store = await _store(spec)
    raw = openai.AsyncOpenAI(api_key="sk-test", base_url=f"{base_url}/v1", max_retries=0)
    limits = ModelLimits(100_000, input_limit=100_000)
    try:
        async with ContextMiddleware(store, memory_root, model=limits) as mw:
            client = wrap_openai(raw, mw, session_id=session_id)
            print(json.dumps({"ready": True}), flush=True)
            while True:
                line = await anyio.to_thread.run_sync(sys.stdin.readline)
                if not line:
                    return
                request = json.loads(line)
                try:
                    reply = await client.chat.completions.create(
                        model="gpt-test", messages=request["messages"], tools=TOOLS
                    )
                    message = reply.choices[0].message.model_dump(mode="json", exclude_unset=True)
                    print(json.dumps({"message": message}), flush=True)
                except Exception as exc:  # reported to the test, which fails on it
                    print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
    finally:
        await raw.close()
        await store.aclose()


if __name__ == "__main__":
    store_spec, server_url, session, memory = sys.argv[1:5]
    anyio.run(main, store_spec, server_url, session, memory)
