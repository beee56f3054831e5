"""Every SQL statement of the archive on the platform and source databases: jobs, plans, the
read-only source queries."""
