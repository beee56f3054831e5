"""The operator console on the web (``orbit console serve``, issue 29, docs/console.md): the
fleet, plans, jobs, dead letters and the audit log, with viewer and operator roles."""
