"""The library's logger: one name, and a ``NullHandler`` so it is silent until configured."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path

import mimo_ctx

PACKAGE = Path(mimo_ctx.__file__).resolve().parent


def test_the_library_logger_has_a_null_handler() -> None:
    handlers = logging.getLogger("mimo_ctx").handlers
    assert any(isinstance(h, logging.NullHandler) for h in handlers)


def test_every_module_logs_under_the_library_logger() -> None:
    names = {
        match.group(1)
        for path in PACKAGE.rglob("*.py")
        for match in re.finditer(r"getLogger\(([^)]*)\)", path.read_text(encoding="utf-8"))
    }
    assert names <= {'"mimo_ctx"', "__name__"}


def test_a_warning_prints_nothing_without_logging_configured() -> None:
    code = (
        "import logging, mimo_ctx\nlogging.getLogger('mimo_ctx').warning('should not be printed')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stderr == ""
