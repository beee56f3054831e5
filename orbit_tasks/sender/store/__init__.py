"""Every SQL statement of the outbox sender (business database, SQLAlchemy Core), one module per
concern: entries, claims, fenced outcomes, the deadline sweep, operators' listing, dead letters
and retention; rows come back as typed frozen values (``rows.py``).

Ownership of a row is the compare-and-set claim (``state``/``lease_epoch``/``wake_at`` as seen);
every outcome write is fenced by ``lease_epoch = :mine AND state = 'SENDING'``: ``rowcount != 1``
means a newer claim owns the row and the result is dropped.

Time: every function takes ``now`` as a value. Callers read it through the project's one seam,
:class:`orbit_tasks.db.engine.Clock` (default ``DB_CLOCK``, SPEC §2 "one clock"), so that tests
can put the store at ``boundary - 1 µs``, ``= boundary`` and ``+ 1 µs`` without sleeping.
"""
