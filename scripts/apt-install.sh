#!/bin/sh
# apt-install.sh PACKAGE PURPOSE FALLBACK: install a Debian package for `make install`, where this can be
# done here (as root, with apt); anywhere else nothing happens. PURPOSE is said before, FALLBACK if it fails.
set -u
[ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 || exit 0

echo "installing $1 ($2)"
get() { apt-get install -y -q --no-install-recommends "$1" >/dev/null 2>&1; }
if ! { get "$1" || { apt-get update -q >/dev/null 2>&1 && get "$1"; }; }; then
    echo "$1 could not be installed: $3"
fi
exit 0
