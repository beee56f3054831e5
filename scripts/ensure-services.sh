#!/usr/bin/env bash
# Make sure the real MariaDB, Redis and RabbitMQ answer (the tests use them); start them if they do
# not.
set -euo pipefail

mariadb_up() { mysqladmin --protocol=tcp -h127.0.0.1 -uroot ping >/dev/null 2>&1; }
redis_up() { redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; }
rabbitmq_up() { rabbitmqctl -q status >/dev/null 2>&1 && (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null; }

if ! mariadb_up; then
  if ! command -v mariadbd >/dev/null 2>&1 && [[ ! -x /usr/sbin/mariadbd ]]; then
    echo "ensure-services: installing mariadb-server"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mariadb-server >/dev/null
  fi
  echo "ensure-services: starting MariaDB"
  mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld 2>/dev/null || true
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd
  for _ in $(seq 1 60); do mariadb_up && break; sleep 1; done
  mariadb_up || { echo "ensure-services: MariaDB did not start" >&2; exit 1; }
fi

if ! redis_up; then
  if ! command -v redis-server >/dev/null 2>&1; then
    echo "ensure-services: installing redis-server"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  fi
  echo "ensure-services: starting Redis"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  for _ in $(seq 1 30); do redis_up && break; sleep 1; done
  redis_up || { echo "ensure-services: Redis did not start" >&2; exit 1; }
fi

# RabbitMQ (issue 30): the broker-parametrised tests use one virtual host each on it
# (tests/support/rabbitmq.py) and start private nodes with the same binaries.
if ! rabbitmq_up; then
  if ! command -v rabbitmq-server >/dev/null 2>&1; then
    echo "ensure-services: installing rabbitmq-server"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=300 \
      rabbitmq-server >/dev/null
  fi
  echo "ensure-services: starting RabbitMQ"
  rabbitmq-server -detached
  for _ in $(seq 1 90); do rabbitmq_up && break; sleep 1; done
  rabbitmq_up || { echo "ensure-services: RabbitMQ did not start" >&2; exit 1; }
fi
