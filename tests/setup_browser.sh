#!/bin/sh
# Installs Debian's chromium for tests/test_report_browser.py when it is missing
# (tox runs this first; CI runs as root with Debian's registry reachable).
# Never fails: without a browser the tests skip, or fail where CI requires them.
chromium="${STEPSCOPE_CHROMIUM:-/usr/bin/chromium}"
[ -x "$chromium" ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup_browser: installing chromium (apt-get)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        chromium fonts-dejavu-core >/dev/null || echo "setup_browser: apt-get could not install chromium" >&2
else
    echo "setup_browser: $chromium is missing and apt-get needs root; the browser tests will skip" >&2
fi
exit 0
