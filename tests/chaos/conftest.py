"""The chaos suite's figures: each test reports one line, shown after the run whatever `-s` says."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

LINES: list[str] = []


@pytest.fixture
def chaos_report() -> Callable[..., str]:
    """Return a function that records a test's figures (one line, also appended to a file)."""

    def report(scenario: str, **figures: Any) -> str:
        shown = " ".join(f"{name.replace('_', '-')}={value}" for name, value in figures.items())
        line = f"chaos {scenario} on {connection.vendor}: {shown}"
        LINES.append(line)
        with (settings.STATE_DIR / "chaos-figures.txt").open("a") as out:
            out.write(line + "\n")
        return line

    return report


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if LINES:
        terminalreporter.section("chaos figures")
        for line in LINES:
            terminalreporter.write_line(line)
