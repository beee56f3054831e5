"""Restore archived jobs into a database (docs/archive-format.md, "Restore")."""
