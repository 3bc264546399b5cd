"""Exit 0 when the database server named by a DATABASE_URL accepts connections, else 1."""

import sys

import environ

config = environ.Env.db_url_config(sys.argv[1])
try:
    if config["ENGINE"].endswith("postgresql"):
        import psycopg

        psycopg.connect(
            host=config["HOST"],
            port=config["PORT"] or 5432,
            user=config["USER"],
            password=config["PASSWORD"],
            dbname="postgres",
            connect_timeout=3,
        ).close()
    else:
        import MySQLdb

        MySQLdb.connect(
            host=config["HOST"],
            port=int(config["PORT"] or 3306),
            user=config["USER"],
            password=config["PASSWORD"],
            connect_timeout=3,
        ).close()
except Exception as exc:  # any failure means "not reachable"
    print(f"not reachable: {exc}", file=sys.stderr)
    sys.exit(1)
