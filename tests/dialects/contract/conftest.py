"""The dialect contract: what every database's claim, finish, promote and reclaim must do,
one module per part of a dialect (as River's driver suite is split).

One suite, run unchanged on SQLite, PostgreSQL and MariaDB/MySQL (Oban's and River's habit per
engine): each test names a behaviour of the lease protocol, and drives the dialect's own
methods (`claim_ready`, `mark_claimed`, `finish_many`, `finish_simple`, `promote`, `now`) and
the transitions built on them (`leases`, the promoter, the reclaimer). A dialect that overrides
one of them with its own SQL must pass the same tests as the portable version in `base.py`.
A test is skipped only where a capability is absent, named by the dialect's flag; tests of one
vendor's quirks live in tests/dialects/ (test_explain.py, test_isolation_levels.py, ...).
"""

from tests.support.dialect_contract import claim_by, dialect, finish_by

__all__ = ["claim_by", "dialect", "finish_by"]
