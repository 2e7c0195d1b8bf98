#!/usr/bin/env bash
# Source me: installs and starts PostgreSQL 15 (127.0.0.1:5432, database cua_test) and chromium,
# then exports CUA_TEST_PG_URL for the monitor store and dashboard tests. Needs root (Debian 12).
_cua_saved_flags="$-"
_cua_saved_pipefail="$(shopt -po pipefail)"
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive
if ! command -v pg_ctlcluster >/dev/null 2>&1 || [ ! -x /usr/bin/chromium ]; then
    apt-get update -qq
    apt-get install -y -qq postgresql chromium >/dev/null
fi

pg_ctlcluster 15 main status >/dev/null 2>&1 || pg_ctlcluster 15 main start
for _ in $(seq 1 30); do
    pg_isready -h 127.0.0.1 -p 5432 -q && break
    sleep 1
done

su postgres -c "psql -v ON_ERROR_STOP=1 -q" <<'SQL'
DO $$ BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'cua') THEN
        CREATE ROLE cua LOGIN PASSWORD 'cua' CREATEDB;
    END IF;
END $$;
SQL
if ! su postgres -c "psql -tAc \"SELECT 1 FROM pg_database WHERE datname = 'cua_test'\"" | grep -q 1; then
    su postgres -c "createdb -O cua cua_test"
fi

export CUA_TEST_PG_URL="postgresql+psycopg://cua:cua@127.0.0.1:5432/cua_test"
export CUA_TEST_CHROMIUM=/usr/bin/chromium
case "$_cua_saved_flags" in *e*) ;; *) set +e ;; esac
case "$_cua_saved_flags" in *u*) ;; *) set +u ;; esac
eval "$_cua_saved_pipefail"
unset _cua_saved_flags _cua_saved_pipefail
