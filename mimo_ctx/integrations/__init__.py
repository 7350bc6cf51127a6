"""Framework integrations: mimo_ctx in one line of an agent's construction.

* :mod:`mimo_ctx.integrations.pydantic_ai` — :class:`MimoCtxCapability`, a
  pydantic-ai (2.x) capability: ``Agent(model, capabilities=[MimoCtxCapability(mw)])``.
  Extra: ``pip install "mimo-ctx[pydantic-ai]"``.
* :mod:`mimo_ctx.integrations.langchain` — :class:`MimoCtxMiddleware`, a LangChain
  (1.x) agent middleware:
  ``create_agent(model, tools, middleware=[MimoCtxMiddleware(mw, session_id="s1")])``.
  Extra: ``pip install "mimo-ctx[langchain]"``.

Both drive the same :class:`~mimo_ctx.middleware.ContextMiddleware` as the
provider wrappers (one store, one writer coordinator, one rebuild
implementation) and share the history sync of :mod:`mimo_ctx.integrations._sync`:
the framework keeps its full history, mimo_ctx stores each message once and
rewrites only what is sent to the model. Importing this package imports no
framework; each submodule raises an ImportError naming its extra when the
framework is missing.
"""

from __future__ import annotations

__all__: list[str] = []
