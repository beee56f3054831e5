-- Runs once, on the first start of the database service (MySQL 8.0 or MariaDB 10.11), after the
-- image created the platform database `orbit` and the user `orbit` (MYSQL_/MARIADB_ variables).
-- The business (outbox) database is the application's own; in this demo deployment it lives on
-- the same server. Both are utf8mb4: the migrations choose each table's collation (SPEC §2).
CREATE DATABASE IF NOT EXISTS app CHARACTER SET utf8mb4;
GRANT ALL PRIVILEGES ON app.* TO 'orbit'@'%';
