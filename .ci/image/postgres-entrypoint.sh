#!/bin/sh
# The entrypoint of countlimit-ci/postgres:15 (built by .ci/images): what the
# official postgres image's docker-entrypoint.sh does, as far as
# testcontainers-go's postgres module and compose files rely on it.
#
#   - POSTGRES_USER (default postgres), POSTGRES_PASSWORD (required unless
#     POSTGRES_HOST_AUTH_METHOD=trust), POSTGRES_DB (default the user),
#     POSTGRES_INITDB_ARGS, /docker-entrypoint-initdb.d/*.sh and *.sql;
#   - the cluster in $PGDATA, initialised on first start by a temporary
#     server on the socket only, then the real one listening on every
#     address: "database system is ready to accept connections" is logged
#     twice, which the module's default wait strategy counts on;
#   - "postgres -c fsync=off" and bare flags ("-c x=y") as the command;
#   - root drops to the postgres user.
set -eu

if [ "${1#-}" != "$1" ]; then
	set -- postgres "$@"
fi
if [ "$1" != postgres ]; then
	exec "$@"
fi

if [ "$(id -u)" = 0 ]; then
	mkdir -p "$PGDATA" /var/run/postgresql
	chown -R postgres:postgres "$PGDATA" /var/run/postgresql
	chmod 700 "$PGDATA"
	exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi

if [ ! -s "$PGDATA/PG_VERSION" ]; then
	: "${POSTGRES_USER:=postgres}"
	: "${POSTGRES_DB:=$POSTGRES_USER}"
	: "${POSTGRES_HOST_AUTH_METHOD:=scram-sha-256}"
	if [ -z "${POSTGRES_PASSWORD:-}" ] && [ "$POSTGRES_HOST_AUTH_METHOD" != trust ]; then
		echo >&2 "error: POSTGRES_PASSWORD is not set (or set POSTGRES_HOST_AUTH_METHOD=trust)"
		exit 1
	fi
	pwfile=$(mktemp)
	printf '%s\n' "${POSTGRES_PASSWORD:-}" >"$pwfile"
	# shellcheck disable=SC2086 # POSTGRES_INITDB_ARGS is a list of flags
	initdb -D "$PGDATA" --username="$POSTGRES_USER" --pwfile="$pwfile" \
		--encoding=UTF8 --locale=C.UTF-8 --auth-local=trust \
		--auth-host="$POSTGRES_HOST_AUTH_METHOD" ${POSTGRES_INITDB_ARGS:-}
	rm -f "$pwfile"
	printf 'host all all all %s\n' "$POSTGRES_HOST_AUTH_METHOD" >>"$PGDATA/pg_hba.conf"
	printf "listen_addresses = '*'\n" >>"$PGDATA/postgresql.conf"

	pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start
	psql="psql -v ON_ERROR_STOP=1 --no-psqlrc --username=$POSTGRES_USER --dbname=postgres"
	if [ "$POSTGRES_DB" != postgres ]; then
		$psql -q --set db="$POSTGRES_DB" <<-'SQL'
			CREATE DATABASE :"db";
		SQL
	fi
	for f in /docker-entrypoint-initdb.d/*; do
		case "$f" in
		*.sh) echo "running $f"; . "$f" ;;
		*.sql) echo "running $f"; $psql --dbname="$POSTGRES_DB" -f "$f" ;;
		*) ;;
		esac
	done
	pg_ctl -D "$PGDATA" -m fast -w stop
	echo "PostgreSQL init process complete; ready for start up."
fi

exec "$@"
