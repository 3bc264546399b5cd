"""Connection poolers: the worker's session settings end with each of its transactions, and
through a real transaction-mode PgBouncer the whole cycle works, push wake-up included (its
LISTEN on a direct alias), while no other client of the pool sees any of our settings."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, OperationalError, connection, connections

import django_jobqueue as jobqueue
from django_jobqueue.dialects import get_dialect
from django_jobqueue.models import Job, Worker
from tests.conftest import assert_clean_log, poll, wait_for_job
from tests.support.markers import not_sqlite, only_postgresql

pytestmark = pytest.mark.django_db(transaction=True)

VENDOR = connection.vendor
POSTGRES = only_postgresql("PgBouncer is PostgreSQL's pooler")
# What a worker sets on its own connections, by vendor (MySQL 8 has no idle-transaction bound).
SETTINGS = {
    "postgresql": ("lock_timeout", "idle_in_transaction_session_timeout", "statement_timeout"),
    "mysql": (
        "innodb_lock_wait_timeout",
        "idle_transaction_timeout",
        "max_statement_time",
        "max_execution_time",
    ),
}
POOL_SIZE = 3  # server connections PgBouncer keeps: fewer than the worker's own


def session_values(conn: Any) -> dict[str, Any]:
    """The values this Django connection's session has for the settings a worker makes."""
    values = {}
    with conn.cursor() as cursor:
        for name in SETTINGS[conn.vendor]:
            if conn.vendor == "postgresql":
                cursor.execute(f"SHOW {name}")
            else:
                cursor.execute(
                    "SELECT @@SESSION." + name if _has_variable(cursor, name) else "SELECT NULL"
                )
            values[name] = cursor.fetchone()[0]
        if conn.vendor == "mysql":
            cursor.execute(
                "SELECT @jobqueue_innodb_lock_wait_timeout, @jobqueue_idle_transaction_timeout"
            )
            values["user variables"] = cursor.fetchone()
    return values


def _has_variable(cursor: Any, name: str) -> bool:
    cursor.execute("SHOW SESSION VARIABLES LIKE %s", [name])
    return cursor.fetchone() is not None


@not_sqlite("SQLite's busy timeout is its connection's own")
@pytest.mark.parametrize("fails", [False, True], ids=["committed", "rolled-back"])
def test_worker_transaction_settings_end_with_the_transaction(fails):
    """What bound_waits() and statement_timeout() set holds inside the worker's transaction,
    and the session has its own values back afterwards, even after a failed transaction."""
    dialect = get_dialect(DEFAULT_DB_ALIAS)
    before = session_values(connection)
    seen: dict[str, Any] = {}

    def txn() -> None:
        with dialect.statement_timeout(7.0):
            seen.update(session_values(connection))
            if fails:
                # A failed statement: Django then refuses queries until the rollback.
                with connection.cursor() as cursor:
                    cursor.execute("SELECT * FROM no_such_table_here")

    try:
        dialect.bound_waits(3.0, 11.0)
        try:
            dialect.run_in_transaction(txn)
        except Exception:
            assert fails
        else:
            assert not fails
        if VENDOR == "postgresql":
            assert seen["lock_timeout"] == "3s"
            assert seen["idle_in_transaction_session_timeout"] == "11s"
            assert seen["statement_timeout"] == "7s"
        else:
            assert int(seen["innodb_lock_wait_timeout"]) == 3
            statement = seen["max_statement_time"] or seen["max_execution_time"]
            assert float(statement) in (7.0, 7000.0)
            if connection.mysql_is_mariadb:  # type: ignore[attr-defined]
                assert int(seen["idle_transaction_timeout"]) == 11
        assert session_values(connection) == before
    finally:
        # bound_waits() marked this thread's connection as a worker's: forget it.
        vars(connection).pop("_jobqueue_waits", None)
        vars(connection).pop("_jobqueue_bound_waits", None)


@not_sqlite("SQLite has no statement timeout")
def test_no_statement_of_a_worker_transaction_runs_longer_than_it_may_sit_idle():
    """Every worker transaction bounds its statements (as long as it may sit idle): a slow
    statement is ended by the server instead of holding the transaction open."""
    dialect = get_dialect(DEFAULT_DB_ALIAS)
    before = session_values(connection)
    try:
        dialect.bound_waits(3.0, 11.0)
        seen = dialect.run_in_transaction(lambda: session_values(connection))
        if VENDOR == "postgresql":
            assert seen["statement_timeout"] == "11s"
        elif connection.mysql_is_mariadb:  # type: ignore[attr-defined]
            assert float(seen["max_statement_time"]) == 11.0
        else:
            assert int(seen["max_execution_time"]) == 11000
        assert session_values(connection) == before
        if VENDOR == "postgresql":
            dialect.bound_waits(0.5, 1.0)  # statements: max(1.0, 2 * 0.5) = 1 s
            started = time.monotonic()

            def slow() -> None:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_sleep(5)")

            with pytest.raises(OperationalError, match="statement timeout"):
                dialect.run_in_transaction(slow, tries=1)
            assert time.monotonic() - started < 4.5
    finally:
        vars(connection).pop("_jobqueue_waits", None)
        vars(connection).pop("_jobqueue_bound_waits", None)


@POSTGRES
def test_a_lock_wait_still_ends_as_a_lock_timeout_under_a_short_lease():
    """The statement bound is never below twice the lock wait bound: with a lease TTL under
    LOCK_TIMEOUT, a wait for a row lock still ends as a lock timeout (transient: retried),
    not as a statement timeout."""
    job = jobqueue.enqueue("test.noop")
    dialect = get_dialect(DEFAULT_DB_ALIAS)
    holder = psycopg.connect(**connection.get_connection_params(), autocommit=False)
    try:
        holder.execute("SELECT 1 FROM django_jobqueue_job WHERE id = %s FOR UPDATE", [job.pk])
        dialect.bound_waits(1.0, 0.5)

        def locked() -> None:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT 1 FROM django_jobqueue_job WHERE id = %s FOR UPDATE", [job.pk]
                )

        with pytest.raises(Exception, match="lock timeout"):
            dialect.run_in_transaction(locked, tries=1)
    finally:
        holder.rollback()
        holder.close()
        vars(connection).pop("_jobqueue_waits", None)
        vars(connection).pop("_jobqueue_bound_waits", None)


@POSTGRES
def test_the_bounds_hold_when_a_transaction_begins_with_a_server_side_cursor():
    """A worker transaction on PostgreSQL sends its lock bounds with its first statement; when
    that statement is a named (server-side) cursor's, which cannot carry them, they go first
    on a cursor of their own, and hold."""
    dialect = get_dialect(DEFAULT_DB_ALIAS)

    def txn() -> str:
        list(Job.objects.all().iterator(chunk_size=10))  # DECLARE ... CURSOR: a named cursor
        with connection.cursor() as cursor:
            cursor.execute("SHOW lock_timeout")
            return str(cursor.fetchone()[0])

    try:
        dialect.bound_waits(3.0, 11.0)
        assert dialect.run_in_transaction(txn) == "3s"
    finally:
        vars(connection).pop("_jobqueue_waits", None)
        vars(connection).pop("_jobqueue_bound_waits", None)


@contextmanager
def wire_queries() -> Iterator[list[str]]:
    """The simple queries the default connection sends inside the block, as libpq traces
    them (every message on the wire, psycopg's own BEGIN and COMMIT included)."""
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    sent: list[str] = []
    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE)
        try:
            yield sent
        finally:
            pgconn.untrace()
            trace.seek(0)
            for line in trace:
                direction, _, kind, *rest = line.rstrip("\n").split("\t")
                if direction == "F" and kind == "Query":
                    sent.append(rest[0].strip().strip('"'))


@POSTGRES
@pytest.mark.parametrize("fails", [False, True], ids=["committed", "rolled-back"])
def test_a_worker_transaction_sends_its_begin_with_its_first_statement(fails):
    """psycopg sends a transaction's BEGIN on its own, a round trip; a worker transaction on
    PostgreSQL sends it with its bounds and its first statement instead, as one query. Django
    still ends it: committed, or rolled back when the block raises (a savepoint inside
    works as usual)."""
    from django.db import transaction

    dialect = get_dialect(DEFAULT_DB_ALIAS)
    job = jobqueue.enqueue("test.noop")

    def txn() -> None:
        Job.objects.filter(pk=job.pk).update(priority=7)
        with transaction.atomic():  # a savepoint
            Job.objects.filter(pk=job.pk).update(max_attempts=9)
        if fails:
            raise RuntimeError("the block raises")

    try:
        dialect.bound_waits(3.0, 11.0)
        with wire_queries() as sent, suppress(RuntimeError):
            dialect.run_in_transaction(txn)
    finally:
        vars(connection).pop("_jobqueue_waits", None)
        vars(connection).pop("_jobqueue_bound_waits", None)
    assert sent[0].startswith("BEGIN; SELECT set_config('lock_timeout', '3000ms', true)")
    assert '; UPDATE "django_jobqueue_job"' in sent[0]
    assert "BEGIN" not in sent[1:]
    assert sent[-1] == ("ROLLBACK" if fails else "COMMIT")
    assert connection.connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert connection.get_autocommit()
    row = Job.objects.values_list("priority", "max_attempts").get(pk=job.pk)
    assert row == ((0, 3) if fails else (7, 9))


def _in_a_worker_transaction(txn: Any) -> None:
    """Run `txn` as a worker's transaction (bounded waits); a RuntimeError rolls it back."""
    dialect = get_dialect(DEFAULT_DB_ALIAS)
    try:
        dialect.bound_waits(3.0, 11.0)
        with suppress(RuntimeError):
            dialect.run_in_transaction(txn)
    finally:
        vars(connection).pop("_jobqueue_waits", None)
        vars(connection).pop("_jobqueue_bound_waits", None)


@POSTGRES
def test_inside_a_worker_transaction_psycopg_sees_autocommit_off_as_django_set_it():
    """Once its BEGIN went with the first statement, the transaction looks to psycopg as it
    would otherwise: autocommit off (Django reads it to decide whether a named cursor is WITH
    HOLD, which would outlive the transaction on a pooled server connection)."""
    job, *_ = [jobqueue.enqueue("test.noop") for _ in range(3)]
    seen: dict[str, Any] = {}

    def txn() -> None:
        Job.objects.filter(pk=job.pk).update(priority=1)
        seen["autocommit"] = connection.connection.autocommit
        rows = Job.objects.values_list("pk").iterator(chunk_size=1)  # a named cursor
        next(rows)  # open, and still open
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*), bool_or(is_holdable) FROM pg_cursors")
            seen["cursors"] = cursor.fetchone()
        list(rows)

    with wire_queries() as sent:
        _in_a_worker_transaction(txn)
    assert sent[0].startswith("BEGIN; ")
    assert seen == {"autocommit": False, "cursors": (1, False)}
    assert connection.connection.autocommit  # after the block, as Django left it


@POSTGRES
def test_a_first_statement_refused_before_it_is_sent_leaves_the_block_one_transaction():
    """psycopg refuses the first statement's parameters before sending anything: the block
    carries on (the caller caught it), and what it writes next still rolls back with it."""
    job = jobqueue.enqueue("test.noop")

    def txn() -> None:
        with suppress(Exception), connection.cursor() as cursor:
            cursor.execute("SELECT %s, %s", [1])  # one parameter short: never sent
        Job.objects.filter(pk=job.pk).update(priority=7)
        raise RuntimeError("the block raises")

    _in_a_worker_transaction(txn)
    assert Job.objects.get(pk=job.pk).priority == 0


# -- a real PgBouncer ----------------------------------------------------------------------------


def _pgbouncer_binary() -> str:
    found = shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.access(p, os.X_OK)), None
    )
    if found is None:
        reason = "pgbouncer is not installed (apt-get install pgbouncer)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"the PgBouncer tests cannot run in CI: {reason}")
        pytest.skip(reason)
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def pgbouncer() -> Iterator[str]:
    """Run PgBouncer in transaction mode on a free loopback port, in front of the test
    database; yield its URL. It is stopped on exit."""
    binary = _pgbouncer_binary()
    db = connection.settings_dict
    name, user = db["NAME"], db["USER"] or "postgres"
    host, port = db["HOST"] or "127.0.0.1", db["PORT"] or 5432
    password = f" password={db['PASSWORD']}" if db["PASSWORD"] else ""
    workdir = Path(tempfile.mkdtemp(prefix="jobqueue-pgbouncer-"))
    listen_port = _free_port()
    (workdir / "userlist.txt").write_text(f'"{user}" ""\n')
    (workdir / "pgbouncer.ini").write_text(
        f"[databases]\n{name} = host={host} port={port} dbname={name} user={user}{password}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {listen_port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {workdir / 'userlist.txt'}\n"
        f"pool_mode = transaction\ndefault_pool_size = {POOL_SIZE}\nmax_client_conn = 200\n"
        "ignore_startup_parameters = extra_float_digits\n"
    )
    command = [binary]
    if os.geteuid() == 0:  # PgBouncer refuses to run as root
        owner = pwd.getpwnam("postgres")
        os.chown(workdir, owner.pw_uid, owner.pw_gid)
        for path in workdir.iterdir():
            os.chown(path, owner.pw_uid, owner.pw_gid)
        command += ["-u", "postgres"]
    log = (workdir / "pgbouncer.log").open("w")
    proc = subprocess.Popen(
        [*command, str(workdir / "pgbouncer.ini")], stdout=log, stderr=subprocess.STDOUT
    )
    url = f"postgres://{user}@127.0.0.1:{listen_port}/{name}"
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(
                    f"pgbouncer exited:\n{(workdir / 'pgbouncer.log').read_text()}"
                )
            try:
                psycopg.connect(_dsn(url), connect_timeout=2).close()
            except psycopg.OperationalError:
                return False
            return True

        poll(ready, timeout=30, interval=0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()
        shutil.rmtree(workdir, ignore_errors=True)


def _dsn(url: str) -> str:
    return url.replace("postgres://", "postgresql://", 1)


@contextmanager
def pooled_alias(url: str) -> Iterator[str]:
    """Make "pooled" a Django alias of the test database through the pooler, in this process."""
    import environ

    config = {**environ.Env.db_url_config(url), "DISABLE_SERVER_SIDE_CURSORS": True}
    connections.configure_settings(
        {DEFAULT_DB_ALIAS: settings.DATABASES[DEFAULT_DB_ALIAS], "pooled": config}
    )
    settings.DATABASES["pooled"] = config
    try:
        connections["pooled"].connect()  # see tests/support/extra_databases.py: open it eagerly
        yield "pooled"
    finally:
        with suppress(AttributeError):
            connections["pooled"].close()
            del connections["pooled"]
        settings.DATABASES.pop("pooled", None)


def server_defaults() -> dict[str, str]:
    """The settings' values in a new session straight to the server."""
    with psycopg.connect(**_direct()) as conn:
        return {n: conn.execute(f"SHOW {n}").fetchone()[0] for n in SETTINGS["postgresql"]}


def _direct() -> dict[str, Any]:
    db = connection.settings_dict
    return {
        "host": db["HOST"] or "127.0.0.1",
        "port": db["PORT"] or 5432,
        "dbname": db["NAME"],
        "user": db["USER"] or "postgres",
        "password": db["PASSWORD"] or None,
    }


def pooled_sessions(url: str) -> dict[int, dict[str, str]]:
    """What plain clients of the pool see on every server connection: {backend pid: values}.

    POOL_SIZE clients each hold a transaction open at once, so each is given a server
    connection of its own: together they see every one the pool has.
    """
    clients = [psycopg.connect(_dsn(url)) for _ in range(POOL_SIZE)]
    try:
        seen = {}
        for client in clients:  # not autocommit: each SHOW is in the client's transaction
            pid = client.execute("SELECT pg_backend_pid()").fetchone()[0]
            seen[pid] = {
                n: client.execute(f"SHOW {n}").fetchone()[0] for n in SETTINGS["postgresql"]
            }
        return seen
    finally:
        for client in clients:
            client.close()


def assert_no_leak(url: str, defaults: dict[str, str]) -> None:
    seen = pooled_sessions(url)
    assert len(seen) == POOL_SIZE
    leaked = {pid: values for pid, values in seen.items() if values != defaults}
    assert not leaked, f"settings on pooled server connections (defaults {defaults}): {leaked}"


def listening() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND query = 'LISTEN django_jobqueue'"
        )
        return bool(cursor.fetchone()[0])


@POSTGRES
def test_worker_through_a_transaction_pooler_leaks_no_setting(start_worker, settings, tmp_path):
    """Enqueue, claim, finish, heartbeat, reclaim and push wake-up all go through a
    transaction-mode PgBouncer (the LISTEN on a direct alias), and no plain client of the pool
    ever sees the worker's lock, idle or statement timeouts."""
    defaults = server_defaults()
    with pgbouncer() as url, pooled_alias(url):
        settings.JOBQUEUE = {**settings.JOBQUEUE, "DATABASE": "pooled"}  # enqueue() through it
        env = {
            "JOBQUEUE_TEST_POOLED_URL": url,
            "JOBQUEUE_TEST_DATABASE": "pooled",
            "JOBQUEUE_TEST_LISTEN_DATABASE": "default",
        }
        # Polls a minute apart: a job done well before then was woken by its NOTIFY.
        args = ("--poll-interval", "60", "--lease-ttl", "4", "--heartbeat-interval", "1")
        worker = start_worker(*args, "--concurrency", "2", env=env)
        warm = jobqueue.enqueue("test.noop")
        wait_for_job(warm.pk, Job.State.DONE)  # claimed by the poll at start-up
        registered = worker.wait_registered()
        poll(listening, timeout=30)
        time.sleep(0.5)  # idle now: its next poll is a minute away

        woken = jobqueue.enqueue("test.add", {"a": 2, "b": 3})
        assert wait_for_job(woken.pk, Job.State.DONE, timeout=30).result == 5

        # Twice the lease TTL: it stays ours only if the heartbeat renews it through the pool.
        long = jobqueue.enqueue("test.sleep", {"seconds": 8})
        wait_for_job(long.pk, Job.State.RUNNING)
        assert_no_leak(url, defaults)  # during the run
        done = wait_for_job(long.pk, Job.State.DONE, timeout=60)
        assert done.attempts == 1
        beat = Worker.objects.get(pk=registered.pk).heartbeat_at
        assert beat > registered.heartbeat_at

        # A worker killed with a job in hand: another one reclaims it, through the pool too.
        crash = jobqueue.enqueue("test.crash_once", {"marker": str(tmp_path / "crashed")})
        assert worker.wait(60) == 137
        rescuer = start_worker(*args, env=env)
        rescued = wait_for_job(crash.pk, Job.State.DONE, timeout=90)
        assert rescued.attempts == 2
        assert rescuer.stop() == 0
        assert_clean_log(rescuer.output())
        assert_no_leak(url, defaults)  # after it
