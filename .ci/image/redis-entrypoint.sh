#!/bin/sh
# The entrypoint of countlimit-ci/redis:7 (built by .ci/images): what the
# official redis image does, as far as testcontainers-go's redis module
# relies on it. Debian's redis-server binds to loopback with protected mode
# by default; the official image's build answers on every address, so we say
# so on the command line. Flags alone ("--appendonly yes") or a .conf file
# as the command run redis-server with them; root drops to the redis user.
set -eu

if [ "${1#-}" != "$1" ] || [ "${1%.conf}" != "$1" ]; then
	set -- redis-server "$@"
fi
if [ "$1" != redis-server ]; then
	exec "$@"
fi

if [ "$(id -u)" = 0 ]; then
	chown redis:redis .
	exec setpriv --reuid=redis --regid=redis --init-groups "$0" "$@"
fi

shift
case "${1:-}" in
*.conf) exec redis-server "$@" ;; # the file says where to listen
*) exec redis-server --bind 0.0.0.0 --protected-mode no "$@" ;;
esac
