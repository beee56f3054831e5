"""Archived roots as a Parquet file (``orbit archive export --format parquet``, issue 28 item 4),
typed from the jobs' table descriptions; pyarrow is the optional extra ``orbit-tasks[parquet]``.

One row per root: the root table's columns, in the description's order, then one column per
child table, named after it, holding the root's child rows as ``list<struct<...>>`` (an empty
list when it has none), so that one file holds the window and a reader unnests the children
where it needs them (``SELECT ... FROM f, unnest(orbit_task_attempts)``). Types, from the
``orbit-archive/2`` vocabulary (:mod:`orbit_tasks.archive.format.tables`):

==========================================  =================================================
archived column type                        Parquet (Arrow) type
==========================================  =================================================
``BINARY(n)``                               ``fixed_size_binary(n)``
``VARBINARY(n)``                            ``binary``
``CHAR``, ``VARCHAR``, ``*TEXT``            ``string`` (JSON columns: the stored text, byte for
                                            byte; the exact decimals inside stay exact)
``TINYINT`` .. ``BIGINT`` [``UNSIGNED``]    ``int8`` .. ``int64`` (``uint8`` .. ``uint64``;
                                            ``MEDIUMINT``: ``int32``/``uint32``)
``DATETIME(6)``                             ``timestamp[us, tz=UTC]``
==========================================  =================================================

Nullability is the column's. Values are decoded by the restore's own row decoder (a row's
columns exactly the described ones, each value checked against its column: a value that does
not fit raises :class:`FormatError` naming the column). Memory is bounded: rows are buffered
for one row group (``ROW_GROUP_ROOTS`` roots or ``ROW_GROUP_ROWS`` rows with the children) and
written out.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import IO, Any

import pyarrow as pa  # the optional extra: imported only by `archive export --format parquet`
import pyarrow.parquet as pq

from orbit_tasks.archive.format.tables import INT_BITS, ColumnSpec, SourceSchema, TableSpec
from orbit_tasks.archive.restore.rows import decode_row
from orbit_tasks.errors import OrbitError

ROW_GROUP_ROOTS = 8192
ROW_GROUP_ROWS = 65536  # roots and child rows of one row group
COMPRESSION = "zstd"

_SIGNED = {8: pa.int8(), 16: pa.int16(), 24: pa.int32(), 32: pa.int32(), 64: pa.int64()}
_UNSIGNED = {8: pa.uint8(), 16: pa.uint16(), 24: pa.uint32(), 32: pa.uint32(), 64: pa.uint64()}


def arrow_type(col: ColumnSpec) -> pa.DataType:
    """The Arrow type of an archived column (the table of the module docstring)."""
    if col.encoding == "integer":
        bits = INT_BITS[col.base]
        return _UNSIGNED[bits] if col.unsigned else _SIGNED[bits]
    if col.encoding == "hex":
        return pa.binary(col.length or 0) if col.base == "BINARY" else pa.binary()
    if col.encoding == "timestamp":
        return pa.timestamp("us", tz="UTC")
    if col.encoding == "text":
        return pa.string()
    raise OrbitError(f"column {col.name}: no Parquet type for encoding {col.encoding!r}")


def _fields(spec: TableSpec) -> list[pa.Field]:
    return [pa.field(c.name, arrow_type(c), nullable=c.nullable) for c in spec.columns]


def arrow_schema(schema: SourceSchema, metadata: Mapping[str, Any] | None = None) -> pa.Schema:
    """The root's columns, then one ``list<struct>`` column per child table."""
    fields = _fields(schema.root)
    for spec, _parent in schema.children:
        if spec.name in schema.root.name_set:
            raise OrbitError(
                f"child table {spec.name} has the name of a column of {schema.root.name}; "
                "no Parquet schema holds both"
            )
        child = pa.struct(_fields(spec))
        fields.append(pa.field(spec.name, pa.list_(pa.field("item", child, nullable=False)),
                               nullable=False))  # fmt: skip
    meta = None
    if metadata is not None:
        meta = {b"orbit.export": json.dumps(metadata, sort_keys=True).encode("utf-8")}
    return pa.schema(fields, metadata=meta)


class ParquetRoots:
    """Writes decoded root lines to ``out`` one row group at a time."""

    def __init__(
        self,
        out: IO[bytes],
        schema: SourceSchema,
        metadata: Mapping[str, Any] | None = None,
        *,
        row_group_roots: int | None = None,
        row_group_rows: int | None = None,
    ) -> None:
        self.schema = schema
        self.arrow = arrow_schema(schema, metadata)
        self.writer = pq.ParquetWriter(out, self.arrow, compression=COMPRESSION)
        self.row_group_roots = row_group_roots or ROW_GROUP_ROOTS
        self.row_group_rows = row_group_rows or ROW_GROUP_ROWS
        self.roots = 0
        self._clear()

    def _clear(self) -> None:
        self.columns: dict[str, list[Any]] = {name: [] for name in self.arrow.names}
        self.buffered = self.buffered_rows = 0

    def add(self, line: Mapping[str, Any]) -> None:
        """One archived line ``{"root": {...}, "children": {...}}``; raises
        :class:`~orbit_tasks.archive.format.values.FormatError` for a value that does not fit
        its column."""
        root = decode_row(self.schema.root, line["root"])
        for name in self.schema.root.names:
            self.columns[name].append(root[name])
        rows = 1
        children = line["children"]
        for spec, _parent in self.schema.children:
            kids = [decode_row(spec, r) for r in children.get(spec.name, [])]
            rows += len(kids)
            self.columns[spec.name].append(kids)
        self.buffered += 1
        self.buffered_rows += rows
        self.roots += 1
        if self.buffered >= self.row_group_roots or self.buffered_rows >= self.row_group_rows:
            self.flush()

    def flush(self) -> None:
        if not self.buffered:
            return
        arrays = [pa.array(self.columns[f.name], type=f.type) for f in self.arrow]
        self.writer.write_table(pa.Table.from_arrays(arrays, schema=self.arrow))
        self._clear()

    def close(self) -> None:
        """The last row group and the footer (a file with no root has the schema only)."""
        self.flush()
        self.writer.close()

    def abandon(self) -> None:
        """Stop without the buffered rows (the caller removes the file); never raises."""
        self._clear()
        with contextlib.suppress(Exception):
            self.writer.close()
