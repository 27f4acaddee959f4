#!/bin/sh
# First start only (docker-entrypoint-initdb.d): the migration role, with a password, so that
# `memfabric db migrate` can log in as it over TCP (MEMFABRIC_MIGRATOR_URL). The bootstrap of
# migrate finds it and leaves it as it is.
set -eu
psql -v ON_ERROR_STOP=1 -v pw="$MEMFABRIC_MIGRATOR_PASSWORD" \
  --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" <<'SQL'
SELECT pg_catalog.format('CREATE ROLE fabric_migrator LOGIN CREATEROLE BYPASSRLS PASSWORD %L', :'pw')
WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'fabric_migrator') \gexec
SQL
