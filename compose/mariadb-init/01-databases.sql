-- Two databases, two migration chains: the platform's, and an application's (business) one.
CREATE DATABASE IF NOT EXISTS orbit CHARACTER SET utf8mb4;
CREATE DATABASE IF NOT EXISTS app CHARACTER SET utf8mb4;
CREATE USER IF NOT EXISTS 'orbit'@'%' IDENTIFIED BY 'orbit-dev-password';
GRANT ALL PRIVILEGES ON orbit.* TO 'orbit'@'%';
GRANT ALL PRIVILEGES ON app.* TO 'orbit'@'%';
