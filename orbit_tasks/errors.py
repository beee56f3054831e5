"""One exception tree for the whole project.

Every error the operator can see derives from :class:`OrbitError`; its ``exit_code`` is what the
``orbit`` CLI exits with (SPEC §9): 2 usage / invalid input, 3 conflict, 4 not found, 1 other.
Messages name the bad value and the allowed range; they never carry secrets or business content.

Stores and rules name the fields of their callers' values (``batch_size``, ``expect_revision``),
never a command's flags: a message may hold ``{field}`` placeholders for the ``fields`` it names,
``str(exc)`` shows the field names, and the CLI words them as its flags
(:func:`orbit_tasks.error_lines.describe_error`). Nor do they spell a command: an error that
points the operator to one names it as a :class:`Command` value at a ``{command}`` placeholder,
with the values its wording needs (``command_args``), and the CLI spells the command.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping


class Command(enum.StrEnum):
    """What an error points the operator to, named by the store or rule that raises it; only the
    CLI spells it as a command (``error_lines.COMMANDS``); ``str(exc)`` shows the value."""

    STORAGE_LIST = "storage_list"  # the registered storages
    POLICY_SET = "policy_set"  # create a retention policy (``command_args``: kind)
    PLAN_ENABLE = "plan_enable"  # enable a plan
    PLAN_CONFIRM_POLICY = "plan_confirm_policy"  # confirm a plan's latest policy revision
    JOB_SHOW = "job_show"  # one job's state
    JOB_LIST = "job_list"  # the jobs of a namespace, a page at a time


class OrbitError(Exception):
    """Base of every project error. ``exit_code`` 1 = other error."""

    exit_code = 1

    def __init__(
        self,
        message: str = "",
        *,
        fields: tuple[str, ...] = (),
        command: Command | None = None,
        command_args: Mapping[str, str] | None = None,
    ) -> None:
        self.template = message
        self.fields = fields
        self.command = command
        self.command_args = dict(command_args or {})
        super().__init__(self.worded({}))

    def worded(
        self, names: Mapping[str, str], commands: Mapping[Command, str] | None = None
    ) -> str:
        """The message with each ``{field}`` placeholder as ``names[field]`` (else the field)
        and its ``{command}`` as ``commands[command]`` (else the command's value), in which each
        ``{arg}`` of ``command_args`` is replaced by its value."""
        text = self.template
        if self.command is not None:
            spelled = (commands or {}).get(self.command, self.command.value)
            for arg, value in self.command_args.items():
                spelled = spelled.replace("{" + arg + "}", value)
            text = text.replace("{command}", spelled)
        for field in self.fields:  # plain replacement: braces in values stay as they are
            text = text.replace("{" + field + "}", names.get(field, field))
        return text


class InvalidInput(OrbitError):
    """Bad input from an operator or caller (out of range, malformed). Nothing was written."""

    exit_code = 2


class ConflictError(OrbitError):
    """Stale ``--expect-revision``, illegal state transition, or an identity clash."""

    exit_code = 3


class StaleRevision(ConflictError):
    """The row's revision is not the one the caller expected."""


class IllegalState(ConflictError):
    """The requested change is not allowed from the row's current state."""


class NotFound(OrbitError):
    """A namespace, plan, job, storage or outbox row that does not exist."""

    exit_code = 4


class TransientError(OrbitError):
    """Database or broker unreachable, deadlock, lock wait timeout: retry later, not a failure."""


class LeaseLost(OrbitError):
    """A fenced write matched zero rows: another claim owns the job now. Stop, write nothing."""


class ReaderLost(TransientError):
    """The archive's reader process ended without finishing its stream (killed, a fault of its
    own): the claim stops and its lease expires, like a dropped database connection."""


class ReplicaDiverged(OrbitError):
    """The archive's replica (``ORBIT_ARCHIVE_SOURCE_URL``) is not a copy of the primary: it has
    executed transactions the primary has not (errant GTIDs), or a batch read there differs from
    the same key range on the primary. A job waits ``replica_diverged``; a worker refuses to
    start."""
