#!/bin/sh
# bubblewrap (bwrap), the sandbox that runs generated code (tasks/sandbox.py).
# Installed only where this can be done here: as root, with apt. Anywhere else
# this does nothing; the README says how to get it, and without it the scorer
# falls back to its interpreter guard (recorded as "isolation: guard-only").
set -u

command -v bwrap >/dev/null 2>&1 && exit 0
[ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 || exit 0

echo "installing bubblewrap (the sandbox for generated code)"
if ! { apt-get install -y -q --no-install-recommends bubblewrap >/dev/null 2>&1 ||
    { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends bubblewrap >/dev/null 2>&1; }; }; then
    echo "bubblewrap could not be installed: generated code will run under the interpreter guard only (see README)"
fi
exit 0
