"""Handlers with operators' names, for the admin's browser tests and screenshots."""

from __future__ import annotations

import time

import django_jobqueue as jobqueue


@jobqueue.handler("reports.fetch")
def fetch(account_id: int) -> dict[str, int]:
    time.sleep(0.05)
    return {"account_id": account_id, "rows": 40 + account_id}


@jobqueue.handler("reports.build", takes_context=True)
def build(ctx: jobqueue.JobContext, account_id: int, failures: int = 0) -> dict[str, str]:
    if ctx.attempt <= failures:
        raise RuntimeError(f"upstream API returned 502 for account {account_id}")
    return {"report": f"/reports/{account_id}.pdf"}


@jobqueue.handler("reports.export", takes_context=True)
def export(ctx: jobqueue.JobContext, limit: float = 120.0) -> str:
    """Run until cancelled (or `limit` seconds): a long job an operator stops."""
    deadline = time.monotonic() + limit
    while not ctx.cancelled and time.monotonic() < deadline:
        time.sleep(0.05)
    return "stopped"


@jobqueue.handler("emails.send")
def send(to: str) -> None:
    return None
