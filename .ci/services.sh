#!/usr/bin/env bash
# Source me: installs and starts PostgreSQL 15 (127.0.0.1:5432, database cua_test) and chromium,
# then exports CUA_TEST_PG_URL for the monitor store and dashboard tests. Needs root (Debian 12).
# Test runs that share one PostgreSQL at the same time (several worktrees on one machine) each set
# their own CUA_TEST_PG_DB first: the tests reset their database, so two runs on one would collide.
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
_cua_db="${CUA_TEST_PG_DB:-cua_test}"
case "$_cua_db" in *[!a-z0-9_]*|"") echo "CUA_TEST_PG_DB must be [a-z0-9_]+: $_cua_db" >&2; return 2 ;; esac
if ! su postgres -c "psql -tAc \"SELECT 1 FROM pg_database WHERE datname = '$_cua_db'\"" | grep -q 1; then
    su postgres -c "createdb -O cua $_cua_db"
fi

export CUA_TEST_PG_URL="postgresql+psycopg://cua:cua@127.0.0.1:5432/$_cua_db"
export CUA_TEST_CHROMIUM=/usr/bin/chromium
case "$_cua_saved_flags" in *e*) ;; *) set +e ;; esac
case "$_cua_saved_flags" in *u*) ;; *) set +u ;; esac
eval "$_cua_saved_pipefail"
unset _cua_saved_flags _cua_saved_pipefail _cua_db
