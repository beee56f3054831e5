#!/bin/sh
# The one-shot `migrate` service: wait for the database, run both migration chains, then give
# each archive volume its identity file (all idempotent: safe on every `up`). Every other orbit
# service starts only after this exits 0. Exit codes of `orbit`: 1 = other (the database is not
# up yet: retry), 2/3/4 = a real problem (stop and show it).
set -u
attempt=1
while :; do
  status=0
  orbit db upgrade || status=$?
  [ "$status" -eq 0 ] && break
  if [ "$status" -ne 1 ] || [ "$attempt" -ge 60 ]; then
    echo "migrate: orbit db upgrade failed with exit $status" >&2
    exit "$status"
  fi
  attempt=$((attempt + 1))
  sleep 3
done
set -e
orbit sender db upgrade
orbit storage init /volumes/a --label volume-a
orbit storage init /volumes/b --label volume-b
