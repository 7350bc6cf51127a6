"""The SDKs are optional extras (issue 5, "Done when").

Run in a subprocess with ``openai`` and ``anthropic`` blocked
(``sys.modules[name] = None`` makes their import fail like an absent package):
``mimo_ctx`` and ``mimo_ctx.providers`` (wrappers included) import, and calling a
wrapper raises an ImportError naming the extra to install.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import sys
    for name in ("openai", "anthropic"):
        sys.modules[name] = None

    import mimo_ctx
    import mimo_ctx.providers
    from mimo_ctx.providers import validate_request, wrap_anthropic, wrap_openai
    import mimo_ctx.providers.anthropic_client
    import mimo_ctx.providers.openai_client
    import mimo_ctx.providers._sync

    validate_request([{"role": "user", "content": "hi"}], format="anthropic")
    for wrap in (wrap_openai, wrap_anthropic):
        try:
            wrap(object(), None, session_id="ses_x")
        except ImportError as exc:
            print(exc)
        else:
            raise SystemExit(f"{wrap.__name__} did not raise ImportError")
    loaded = sorted(n for n in ("openai", "anthropic") if sys.modules.get(n) is not None)
    print("loaded:", loaded)
    """
)


def test_wrappers_import_without_sdks_and_name_the_extra() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        'wrap_openai needs the openai SDK: pip install "mimo-ctx[openai]"',
        'wrap_anthropic needs the anthropic SDK: pip install "mimo-ctx[anthropic]"',
        "loaded: []",
    ]


def test_importing_the_providers_loads_no_sdk() -> None:
    """Without blocking anything: importing the wrappers imports no SDK until a call."""
    code = (
        "import sys, mimo_ctx.providers.openai_client, mimo_ctx.providers.anthropic_client; "
        "print(sorted(n for n in ('openai', 'anthropic') if n in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
