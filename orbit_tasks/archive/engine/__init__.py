"""The archive engine: one delivery of a job (runner), its read-ahead threads, the volume I/O,
leftovers and the streaming chain verifier (docs/archive-jobs.md)."""
