"""The archive file format (SPEC §6, docs/archive-format.md): values, manifests, batches, names,
the gzip member, lines, table descriptions, the chain and what a job expects of it. Pure: bytes in,
bytes out, no I/O, no clock."""
