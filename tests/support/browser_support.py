"""What every browser check of the admin does: log in, and collect what goes wrong.

Used by the Playwright tests (tests/admin/test_admin_browser*.py) and by bench/admin_browser.py, so
that "no console error" means the same thing everywhere. Needs only Playwright's page.
"""

from __future__ import annotations

from typing import Any


def watch_problems(page: Any) -> list[str]:
    """Collect the page's console errors, uncaught exceptions and failed loads from now on.

    Failed loads are caught by their address (a browser asks for /favicon.ico, which the
    admin does not serve: not a fault of the pages), so the console's own "Failed to load
    resource" lines are left out; every other console error counts as it is.
    """
    problems: list[str] = []
    page.on(
        "console",
        lambda m: (
            problems.append(m.text)
            if m.type == "error" and not m.text.startswith("Failed to load resource")
            else None
        ),
    )
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.on(
        "response",
        lambda r: (
            problems.append(f"{r.status} {r.url}")
            if r.status >= 400 and not r.url.endswith("/favicon.ico")
            else None
        ),
    )
    return problems


def log_in(page: Any, base: str, username: str, password: str) -> Any:
    """Log in through the admin's login form; return the login page's response."""
    response = page.goto(f"{base}/admin/login/")
    assert response is not None and response.ok, (
        response and response.status,
        page.content()[:3000],
    )
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    page.wait_for_selector("#content-main")
    return response


def wait_for_add_form(page: Any) -> None:
    """Wait until the admin's change_form.js has focused an add form's first field. It runs
    after the page is shown, and on a busy machine a fill begun before it can see its text
    typed into that first field instead (a CI run beside a CPU hog saw the handler's key land
    in the name)."""
    page.wait_for_function(
        "() => ['INPUT', 'SELECT', 'TEXTAREA'].includes(document.activeElement?.tagName)"
    )
