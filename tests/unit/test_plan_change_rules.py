"""The decisions of an operator's plan change and of ``plan run`` (archive.plans, issue 26 item
1): pure rules on what the store read; the errors carry values and only the CLI words flags and
commands (error_lines)."""

from __future__ import annotations

import datetime as dt

import pytest

from orbit_tasks.archive import plans as s
from orbit_tasks.archive.claims import After, Guard, confirm_guard
from orbit_tasks.archive.store.jobs import decode_cursor, list_jobs
from orbit_tasks.error_lines import describe_error
from orbit_tasks.errors import (
    Command,
    IllegalState,
    InvalidInput,
    NotFound,
    OrbitError,
    StaleRevision,
)

T0 = dt.datetime(2026, 1, 1, 0, 0, 0)
DAY = 86400
MIB = 1024**2
STORAGE = b"\x0a" * 16
OTHER = b"\x0b" * 16
NS = b"\x01" * 16


def plan(**kw: object) -> s.Plan:
    base: dict[str, object] = dict(
        namespace_id=NS, kind="tasks", revision=3, enabled=True, policy_revision=2,
        storage_id=STORAGE, interval_seconds=DAY, batch_size=50, max_bytes=8 * MIB,
        next_run_at=T0, active_job_id=None, created_at=T0, updated_at=T0,
    )  # fmt: skip
    base.update(kw)
    return s.Plan(**base)  # type: ignore[arg-type]


def full(**kw: object) -> s.PlanChange:
    base: dict[str, object] = dict(
        storage_id=STORAGE, interval_seconds=DAY, batch_size=50, max_bytes=8 * MIB,
        policy_revision=1,
    )  # fmt: skip
    base.update(kw)
    return s.PlanChange(**base)  # type: ignore[arg-type]


def lines(exc: OrbitError) -> tuple[str, str]:
    """What a caller's ``str`` shows, and the operator's line."""
    return str(exc), describe_error(exc)[0]


# --- merge ----------------------------------------------------------------------------------------


def test_a_new_plan_needs_every_value_and_is_disabled_unless_enabled() -> None:
    with pytest.raises(InvalidInput) as caught:
        s.merge_change("tasks", None, s.PlanChange(storage_id=STORAGE, batch_size=5))
    assert lines(caught.value) == (
        "a new plan needs interval_seconds, max_bytes, policy_revision",
        "a new plan needs --interval, --max-bytes, --policy-revision",
    )
    values = s.merge_change("tasks", None, full())
    assert values == s.PlanValues(
        enabled=False, policy_revision=1, storage_id=STORAGE, interval_seconds=DAY,
        batch_size=50, max_bytes=8 * MIB,
    )  # fmt: skip
    assert s.merge_change("tasks", None, full(enabled=True, expect_revision=0)).enabled is True


def test_a_new_plan_refuses_an_expected_revision_other_than_zero() -> None:
    with pytest.raises(StaleRevision) as caught:
        s.merge_change("tasks", None, full(expect_revision=1))
    assert lines(caught.value) == (
        "plan 'tasks' does not exist (expected revision 1; use 0 or omit expect_revision to "
        "create it)",
        "plan 'tasks' does not exist (expected revision 1; use 0 or omit --expect-revision to "
        "create it)",
    )


def test_a_change_keeps_what_it_does_not_name_and_checks_the_revision() -> None:
    current = plan()
    values = s.merge_change("tasks", current, s.PlanChange(batch_size=7, expect_revision=3))
    assert values.columns() == {
        "enabled": True, "policy_revision": 2, "storage_id": STORAGE,
        "interval_seconds": DAY, "batch_size": 7, "max_bytes": 8 * MIB,
    }  # fmt: skip
    assert s.merge_change("tasks", current, s.PlanChange(enabled=False)).enabled is False
    with pytest.raises(StaleRevision, match="is at revision 3, not 2"):
        s.merge_change("tasks", current, s.PlanChange(expect_revision=2))


def test_merged_values_are_checked_against_their_ranges() -> None:
    with pytest.raises(InvalidInput) as caught:
        s.merge_change("tasks", plan(), s.PlanChange(batch_size=101))
    assert lines(caught.value)[1] == "--batch-size 101 is out of range (allowed 1..100)"
    with pytest.raises(InvalidInput, match="interval_seconds 60s is out of range"):
        s.merge_change("tasks", None, full(interval_seconds=60))


def test_the_expected_revision_is_zero_or_more() -> None:
    s.check_expect_revision(None)
    s.check_expect_revision(0)
    with pytest.raises(InvalidInput) as caught:
        s.check_expect_revision(-1)
    assert lines(caught.value)[1] == "--expect-revision -1 is out of range (allowed 0 or more)"


def test_the_namespace_must_exist_and_be_active() -> None:
    s.check_namespace(NS, "ACTIVE")
    s.check_namespace(NS, "DISABLED", active=False)
    with pytest.raises(NotFound, match=f"namespace {NS.hex()} does not exist"):
        s.check_namespace(NS, None, active=False)
    with pytest.raises(IllegalState, match=f"namespace {NS.hex()} is DISABLED, not ACTIVE"):
        s.check_namespace(NS, "DISABLED")
    assert s.namespace_active("ACTIVE") and not s.namespace_active(None)


# --- references: the store reads the facts, the rule decides ----------------------------------


def test_references_name_the_command_only_in_the_cli() -> None:
    values = s.merge_change("tasks", None, full(policy_revision=2))
    s.check_references("tasks", values, storage_registered=True, latest_policy_revision=2)
    with pytest.raises(NotFound) as storage:
        s.check_references("tasks", values, storage_registered=False, latest_policy_revision=2)
    assert storage.value.command is Command.STORAGE_LIST
    assert lines(storage.value) == (
        f"storage {STORAGE.hex()} is not registered (see storage_list)",
        f"storage {STORAGE.hex()} is not registered (see orbit storage list)",
    )
    with pytest.raises(NotFound) as policy:
        s.check_references("tasks", values, storage_registered=True, latest_policy_revision=None)
    assert policy.value.command_args == {"kind": "tasks"}
    assert lines(policy.value)[1] == (
        "no retention policy for kind 'tasks' in this namespace (create one with "
        "orbit policy set NS tasks --archive-after DURATION)"
    )
    with pytest.raises(InvalidInput) as revision:
        s.check_references("tasks", values, storage_registered=True, latest_policy_revision=1)
    assert lines(revision.value)[1] == (
        "--policy-revision 2 does not exist for kind 'tasks' (allowed 1..1)"
    )


# --- the audit's changes ------------------------------------------------------------------------


def test_changes_name_every_value_of_a_new_plan_and_only_what_differs_after() -> None:
    values = s.merge_change("tasks", None, full())
    created = s.plan_changes(None, values)
    assert list(created) == list(s.CONFIG_FIELDS)
    assert created["storage_id"] == [None, STORAGE.hex()] and created["enabled"] == [None, False]
    current = plan(policy_revision=1, enabled=False)
    assert s.plan_changes(current, values) == {}
    moved = s.merge_change("tasks", current, s.PlanChange(storage_id=OTHER, batch_size=9))
    assert s.plan_changes(current, moved) == {
        "storage_id": [STORAGE.hex(), OTHER.hex()],
        "batch_size": [50, 9],
    }


# --- plan run -----------------------------------------------------------------------------------


def test_a_run_refusal_points_to_the_command_the_cli_spells() -> None:
    ok: dict[str, object] = dict(
        enabled=True, namespace_state="ACTIVE", policy_revision=2, latest_policy_revision=2,
        active_job_id=None,
    )  # fmt: skip
    cases = [
        (dict(enabled=False), None, "(enable it with orbit plan set NS KIND --enable)"),
        (
            dict(latest_policy_revision=3),
            None,
            "(confirm it with orbit plan set --policy-revision)",
        ),
        (dict(active_job_id=b"\x02" * 16), "PENDING", "after it ends (see orbit job show)"),
    ]
    for change, state, tail in cases:
        refusal = s.run_refusal(**{**ok, **change}, active_job_state=state)  # type: ignore[arg-type]
        assert refusal is not None and refusal.command is not None
        exc = s.refuse_run("tasks", refusal)
        assert isinstance(exc, IllegalState) and exc.exit_code == 3
        plain, worded = lines(exc)
        assert plain.startswith("plan 'tasks' cannot run now: ") and "orbit" not in plain
        assert worded.startswith("plan 'tasks' cannot run now: ") and worded.endswith(tail)
        assert worded.count("orbit ") == 1 and plain.endswith(f"{refusal.command.value})")
    inactive = s.run_refusal(**{**ok, "namespace_state": "DISABLED"})  # type: ignore[arg-type]
    assert inactive is not None and inactive.command is None
    assert lines(s.refuse_run("tasks", inactive))[1] == (
        "plan 'tasks' cannot run now: namespace is DISABLED, not ACTIVE"
    )


# --- the job list's cursor and page size ----------------------------------------------------------


def test_a_bad_cursor_and_a_bad_limit_are_worded_by_the_cli() -> None:
    with pytest.raises(InvalidInput) as cursor:
        decode_cursor("!!")
    plain, worded = lines(cursor.value)
    assert plain.startswith("after '!!' is not a cursor printed by job_list (")
    assert worded.startswith("--after '!!' is not a cursor printed by 'orbit job list' (")
    with pytest.raises(InvalidInput) as limit:
        list_jobs(None, NS, limit=0)  # type: ignore[arg-type]  # refused before any statement
    assert lines(limit.value) == (
        "limit 0 is out of range (allowed 1..1000)",
        "--limit 0 is out of range (allowed 1..1000)",
    )


# --- a confirm's lease and guard ------------------------------------------------------------------


def test_only_a_chained_confirm_that_read_the_controls_is_guarded() -> None:
    assert confirm_guard(After.KEEP, 5, 0) is Guard.NONE
    assert confirm_guard(After.RELEASE, 5, 0) is Guard.NONE
    assert confirm_guard(After.CHAIN, None, 0) is Guard.NONE
    assert confirm_guard(After.CHAIN, 5, 0) is Guard.ROW
    assert confirm_guard(After.CHAIN, 0, 0) is Guard.NO_ROW
    assert After("chain") is After.CHAIN and After.KEEP == "keep"


def test_one_lease_fence_builds_every_claim_write_with_or_without_its_prefix() -> None:
    from sqlalchemy import and_
    from sqlalchemy.dialects import mysql

    from orbit_tasks.archive.store.jobs import lease_fence

    def where(**kw: object) -> str:
        fence = lease_fence(NS, b"\x02" * 16, b"\x03" * 16, **kw)  # type: ignore[arg-type]
        return str(and_(*fence).compile(dialect=mysql.dialect()))

    plain = where()
    assert "lease_id = %s" in plain and "state = %s" in plain and "batches" not in plain
    chained = where(prefix=(3, "ab" * 32))
    assert chained.startswith(plain) and "batches = %s" in chained and "last_sha256 = %s" in chained
