"""Settings of the benchmark project: BENCH_DB picks the database (sqlite, pg or mysql).

PostgreSQL and MariaDB on loopback (databases `jobqueue_bench`, created by bench/run.sh);
SQLite in WAL mode in $BENCH_STATE (default .bench-state). Connections persist
(CONN_MAX_AGE=None), as a worker's do in production.
"""

import json
import os
from pathlib import Path

STATE = Path(os.environ.get("BENCH_STATE", Path(__file__).resolve().parents[2] / ".bench-state"))
STATE.mkdir(exist_ok=True)

SECRET_KEY = "bench-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["django_jobqueue", "bench.project.benchapp"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

_db = os.environ.get("BENCH_DB", "sqlite")
if _db == "pg":
    _default = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("BENCH_DB_NAME", "jobqueue_bench"),
        "USER": "postgres",
        "HOST": "127.0.0.1",
        "PORT": "5432",
    }
elif _db == "mysql":
    _default = {
        "ENGINE": "django.db.backends.mysql",
        "NAME": os.environ.get("BENCH_DB_NAME", "jobqueue_bench"),
        "USER": "root",
        "HOST": "127.0.0.1",
        "PORT": "3306",
        "OPTIONS": {"charset": "utf8mb4"},
    }
elif _db == "sqlite":
    _default = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(STATE / "bench.sqlite3"),
        "OPTIONS": {"init_command": "PRAGMA journal_mode=WAL;", "transaction_mode": "IMMEDIATE"},
    }
else:
    raise ValueError(f"BENCH_DB must be sqlite, pg or mysql, not {_db!r}")
_default["CONN_MAX_AGE"] = None
DATABASES = {"default": _default}
JOBQUEUE = {}
# BENCH_DB_POOL='{"max_size": 4}': Django's connection pool (bench/connections.py).
if os.environ.get("BENCH_DB_POOL"):
    _default["OPTIONS"] = {"pool": json.loads(os.environ["BENCH_DB_POOL"])}
    _default["CONN_MAX_AGE"] = 0  # a pool's connections are given back, never kept
if os.environ.get("BENCH_POOL_RETURN"):
    JOBQUEUE["POOL_RETURN"] = os.environ["BENCH_POOL_RETURN"]
# BENCH_PGBOUNCER_PORT=6432: everything through a transaction-mode PgBouncer on that loopback
# port, but the listener's LISTEN, on a direct alias (bench/connections.py).
if os.environ.get("BENCH_PGBOUNCER_PORT"):
    DATABASES["listen"] = dict(_default)
    _default["PORT"] = os.environ["BENCH_PGBOUNCER_PORT"]
    _default["DISABLE_SERVER_SIDE_CURSORS"] = True
    JOBQUEUE["LISTEN_DATABASE"] = "listen"
# BENCH_MAINTENANCE=0: the workers leave the tables' upkeep to the database (bench/backlog.py).
if os.environ.get("BENCH_MAINTENANCE") == "0":
    JOBQUEUE["MAINTENANCE"] = False
# BENCH_RETENTION='{"done": "1m"}': RETENTION for the workers, as JSON (bench/sustained.py).
if os.environ.get("BENCH_RETENTION"):
    JOBQUEUE["RETENTION"] = json.loads(os.environ["BENCH_RETENTION"])
# BENCH_LIMITS='{"api": {"rate": "10/s"}}': LIMITS for the workers, as JSON (bench/limits_claim.py).
for _name in ("GROUP_LIMITS", "RATE_LIMITS", "QUEUE_LIMITS"):
    if os.environ.get(f"BENCH_{_name}"):
        JOBQUEUE[_name] = json.loads(os.environ[f"BENCH_{_name}"])
if os.environ.get("BENCH_LIMITS"):
    JOBQUEUE["LIMITS"] = json.loads(os.environ["BENCH_LIMITS"])
LOGGING = {"version": 1, "disable_existing_loggers": False}
# BENCH_SYNC_CALL_THREADS=16: SYNC_CALL_THREADS for the workers (bench/async_io.py --orm).
if os.environ.get("BENCH_SYNC_CALL_THREADS"):
    JOBQUEUE["SYNC_CALL_THREADS"] = int(os.environ["BENCH_SYNC_CALL_THREADS"])
# BENCH_OTEL=on|traces|metrics: the workers trace and/or measure through an SDK that samples
# every span and exports to nothing (bench/otel.py); BENCH_OTEL_SDK=1: the same SDK without the
# setting (its producer).
_otel = os.environ.get("BENCH_OTEL", "off")
if _otel != "off" or os.environ.get("BENCH_OTEL_SDK") == "1":
    from bench.project.otel_sdk import install

    install()
    if _otel != "off":
        JOBQUEUE["OPENTELEMETRY"] = {"TRACES": _otel != "metrics", "METRICS": _otel != "traces"}
