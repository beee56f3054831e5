"""One beat leader (issue 30 item 3): several ``orbit beat`` processes may run; the one holding
the database lease publishes the ticks, the others stand by (docs/operations.md "Several
beats")."""
