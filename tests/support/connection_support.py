"""A database account of the test's own, whose new connections the server can be made to refuse.

Only that account is limited, never a server-wide setting that other tests or sessions rely
on (max_connections, MariaDB's global max_user_connections). PostgreSQL refuses a role with
`CONNECTION LIMIT 0`, MariaDB a user with `MAX_USER_CONNECTIONS -1`: both turn away new
connections and spare the open ones. MySQL has no such value, so the tests skip there. A
limit above zero would not do on MariaDB: it counts only the sessions opened while the
account had a limit.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.db import OperationalError, connection

# MariaDB's error for a KILL of a session that has ended (ER_NO_SUCH_THREAD).
NO_SUCH_THREAD = 1094


class Account:
    """A login on the test database, with every right on its tables, that can be refused."""

    def __init__(self, name: str, grantee: str) -> None:
        self.name = name
        self.grantee = grantee  # as the server's statements name it
        url = urlsplit(os.environ["DATABASE_URL"])
        self.url = urlunsplit(url._replace(netloc=f"{name}@{url.hostname}:{url.port}"))

    def refuse(self) -> None:
        """Make the server refuse the account's new connections (open ones carry on)."""
        self._limit("CONNECTION LIMIT 0", "MAX_USER_CONNECTIONS -1")

    def allow(self) -> None:
        """Let the account connect again."""
        # MariaDB: 0 is "no limit of the account's own" (the global one, unset on test servers).
        self._limit("CONNECTION LIMIT -1", "MAX_USER_CONNECTIONS 0")

    def _limit(self, postgresql: str, mariadb: str) -> None:
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute(f"ALTER ROLE {self.grantee} {postgresql}")
            else:
                cursor.execute(f"ALTER USER {self.grantee} WITH {mariadb}")

    def sessions(self) -> list[int]:
        """The server's ids of the account's open sessions."""
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("SELECT pid FROM pg_stat_activity WHERE usename = %s", [self.name])
            else:
                cursor.execute(
                    "SELECT ID FROM information_schema.PROCESSLIST WHERE USER = %s", [self.name]
                )
            return [row[0] for row in cursor.fetchall()]


@contextlib.contextmanager
def refusable_account() -> Iterator[Account]:
    """Create an Account for the test's process; end its sessions and drop it afterwards."""
    name = f"jq_limited_{os.getpid()}"
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            account = Account(name, f'"{name}"')
            cursor.execute(f"CREATE ROLE {account.grantee} LOGIN")
            cursor.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {account.grantee}")
            cursor.execute(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {account.grantee}")
        elif connection.vendor == "mysql" and connection.mysql_is_mariadb:
            # The host the server sees this test connect from (loopback): the worker's too.
            cursor.execute("SELECT SUBSTRING_INDEX(USER(), '@', -1)")
            [(host,)] = cursor.fetchall()
            account = Account(name, f"'{name}'@'{host}'")
            cursor.execute(f"CREATE USER {account.grantee}")
            database = connection.ops.quote_name(connection.settings_dict["NAME"])
            cursor.execute(f"GRANT ALL PRIVILEGES ON {database}.* TO {account.grantee}")
        else:
            pytest.skip("MySQL cannot refuse one account's new connections and spare the open")
    try:
        yield account
    finally:
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                    [name],
                )
                cursor.execute(f"DROP OWNED BY {account.grantee}")
                cursor.execute(f"DROP ROLE {account.grantee}")
            else:
                for session in account.sessions():
                    try:
                        cursor.execute(f"KILL CONNECTION {int(session)}")
                    except OperationalError as exc:  # it may have ended meanwhile
                        if exc.args[0] != NO_SUCH_THREAD:
                            raise
                cursor.execute(f"DROP USER {account.grantee}")
