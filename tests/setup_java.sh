#!/bin/sh
# Installs Debian's Java runtime for tests/test_sql_engines.py (PySpark runs on it)
# when there is none (tox runs this first; CI runs as root with Debian's registry
# reachable). Never fails: without Java the Spark test skips, or fails where CI
# requires it.
command -v java >/dev/null 2>&1 && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup_java: installing openjdk-17-jre-headless (apt-get)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        openjdk-17-jre-headless >/dev/null || echo "setup_java: apt-get could not install Java" >&2
else
    echo "setup_java: no java and apt-get needs root; the Spark test will skip" >&2
fi
exit 0
