"""Database layer: engines, column types, dialect variants, schema and migrations."""
