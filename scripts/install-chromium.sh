#!/bin/sh
# Chromium, the headless browser the test suite renders the Snakemake report in (tests/tiny_dag.py:
# check_report). Installed only where this can be done here: as root, with apt. Anywhere else this does
# nothing and that test is skipped, saying why.
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 && exit 0
exec sh "$(dirname "$0")/apt-install.sh" chromium "renders the workflow's report in the tests" \
    "the report rendering test will be skipped"
