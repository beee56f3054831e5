"""A restore writes only the tables of the job's history kind (issue 14 item 6.5): the
manifest's root and child tables are checked against the registry (platform/history.py)."""

from __future__ import annotations

import pytest

from orbit_tasks.archive.format.manifest import source_descriptor
from orbit_tasks.archive.format.tables import parse_source
from orbit_tasks.archive.format.values import FormatError
from orbit_tasks.archive.restore.run import check_kind_tables
from orbit_tasks.platform.history import HISTORY_KINDS, history_kind


@pytest.mark.parametrize("kind", sorted(HISTORY_KINDS))
def test_every_kind_fits_its_own_tables(kind: str) -> None:
    check_kind_tables(parse_source(source_descriptor(history_kind(kind))), history_kind(kind))


def test_a_manifest_of_fewer_children_fits() -> None:
    """Written before a child table existed: the kind's other tables are allowed."""
    doc = source_descriptor(history_kind("tasks"))
    check_kind_tables(parse_source({**doc, "children": []}), history_kind("tasks"))


def test_a_foreign_root_is_refused_naming_it_and_the_allowed_tables() -> None:
    doc = source_descriptor(history_kind("events"))
    with pytest.raises(FormatError) as err:
        check_kind_tables(parse_source(doc), history_kind("tasks"))
    text = str(err.value)
    assert "orbit_events" in text and "'tasks'" in text and "orbit_tasks" in text, text


def test_a_foreign_child_is_refused() -> None:
    doc = source_descriptor(history_kind("tasks"))
    child = {**doc["children"][0], "table": "orbit_credentials"}
    with pytest.raises(FormatError) as err:
        check_kind_tables(parse_source({**doc, "children": [child]}), history_kind("tasks"))
    text = str(err.value)
    assert "orbit_credentials" in text and "orbit_task_attempts" in text, text
