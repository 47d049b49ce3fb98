#!/bin/sh
# Chromium, the headless browser the test suite renders the Snakemake report in (tests/tiny_dag.py:
# check_report). Installed only where this can be done here: as root, with apt. Anywhere else this does
# nothing and that test is skipped, saying why.
set -u

command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 && exit 0
[ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 || exit 0

echo "installing chromium (renders the workflow's report in the tests)"
if ! { apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 ||
    { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1; }; }; then
    echo "chromium could not be installed: the report rendering test will be skipped"
fi
exit 0
