#!/usr/bin/env bash
# Install what the project needs on a fresh Debian machine: system packages for mysqlclient,
# chromium (headless, for the test that renders Flower's workers page) and chromium-driver
# (Selenium drives it in the console's browser tests, tests/browser/), jq (the hand-verification
# script of docs/archive-format.md is run by a test), docker-compose (`config` checks compose/),
# prometheus (`promtool check|test rules` on compose/prometheus/), mariadb-server-core (the
# private `mariadbd` primary and replica of the replica and network-namespace tests), a
# virtualenv in .venv, and the project with its dev extras (boto3 for S3 storages; moto[server],
# the tests' S3 server). Idempotent and quiet when done.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
for pkg in libmariadb-dev pkg-config gcc chromium chromium-driver jq docker-compose prometheus iptables iproute2 \
  mariadb-server-core; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "bootstrap: please install: ${missing[*]} (needs root)" >&2
    exit 1
  fi
  echo "bootstrap: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Another process may hold the dpkg lock for a while: wait for it instead of failing.
  apt-get install -y -qq -o DPkg::Lock::Timeout=300 "${missing[@]}" >/dev/null
fi

stamp=.venv/.installed
if [[ ! -x .venv/bin/python ]]; then
  python3 -m venv .venv
fi
if [[ ! -f $stamp || pyproject.toml -nt $stamp ]]; then
  .venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v -i warning || true
  .venv/bin/python -m pip install -q -e ".[dev]" 2>&1 | grep -v -i warning || true
  .venv/bin/python -c "import orbit_tasks, MySQLdb, celery, sqlalchemy, alembic, boto3, moto.server"
  touch "$stamp"
fi
