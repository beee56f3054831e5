"""History archive: plans, fixed-range jobs, DB leases, SHA-256-chained files on volumes."""
