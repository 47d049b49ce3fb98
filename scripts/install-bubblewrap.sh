#!/bin/sh
# bubblewrap (bwrap), the sandbox that runs generated code (tasks/sandbox.py).
# Installed only where this can be done here: as root, with apt. Anywhere else
# this does nothing; docs/scoring.md says how to get it, and without it the scorer
# falls back to its interpreter guard (recorded as "isolation: guard-only").
command -v bwrap >/dev/null 2>&1 && exit 0
exec sh "$(dirname "$0")/apt-install.sh" bubblewrap "the sandbox for generated code" \
    "generated code will run under the interpreter guard only (see docs/scoring.md)"
