#!/usr/bin/env bash
# Install what the project needs on a fresh Debian machine, in two sizes (issue 27):
#
#   bootstrap.sh          everything `make test` / `.ci/run` need: the system packages to build
#                         mysqlclient, chromium (headless, for the test that renders Flower's
#                         workers page) and chromium-driver (Selenium drives it in the console's
#                         browser tests, tests/browser/), jq (the hand-verification script of
#                         docs/archive-format.md is run by a test), docker-compose (`config` checks
#                         compose/), prometheus (`promtool check|test rules` on compose/prometheus/),
#                         iptables and iproute2 (the partition tests), mariadb-server-core (the
#                         private `mariadbd` primary and replica of the replica and network-namespace
#                         tests), a virtualenv in .venv and the project with its dev extras (moto,
#                         the tests' S3 server; pytest, ruff, mypy).
#   bootstrap.sh --demo   only what `make demo` needs: the packages to build mysqlclient (a
#                         dependency of the package itself: the demo runs on SQLite but the
#                         package installs its MariaDB driver) and the project without dev extras.
#   --list                print the system packages the chosen size needs, one per line; nothing
#                         is installed.
#
# Idempotent and quiet when done: each size has its stamp in .venv (the full one satisfies both).
set -euo pipefail
cd "$(dirname "$0")/.."

mode=all
list=0
for arg in "$@"; do
  case $arg in
    --demo) mode=demo ;;
    --list) list=1 ;;
    *)
      echo "bootstrap: unknown option $arg (allowed --demo, --list)" >&2
      exit 2
      ;;
  esac
done

demo_packages=(libmariadb-dev pkg-config gcc)
test_packages=(chromium chromium-driver jq docker-compose prometheus iptables iproute2 mariadb-server-core)
packages=("${demo_packages[@]}")
if [[ $mode == all ]]; then
  packages+=("${test_packages[@]}")
fi
if ((list)); then
  printf '%s\n' "${packages[@]}"
  exit 0
fi

missing=()
for pkg in "${packages[@]}"; do
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

full=.venv/.installed
demo=.venv/.installed-demo
if [[ ! -x .venv/bin/python ]]; then
  python3 -m venv .venv
fi
fresh() { [[ -f $1 && ! pyproject.toml -nt $1 ]]; }
if [[ $mode == demo ]]; then
  if ! fresh "$full" && ! fresh "$demo"; then
    .venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v -i warning || true
    .venv/bin/python -m pip install -q -e . 2>&1 | grep -v -i warning || true
    .venv/bin/python -c "import orbit_tasks, MySQLdb, celery, sqlalchemy, alembic"
    touch "$demo"
  fi
  exit 0
fi
if ! fresh "$full"; then
  .venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v -i warning || true
  .venv/bin/python -m pip install -q -e ".[dev]" 2>&1 | grep -v -i warning || true
  .venv/bin/python -c "import orbit_tasks, MySQLdb, celery, sqlalchemy, alembic, boto3, moto.server"
  touch "$full"
fi
