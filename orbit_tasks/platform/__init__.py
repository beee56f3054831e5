"""Platform-side models and SQL: tenants, volumes, policies, queues, credentials, history kinds."""
