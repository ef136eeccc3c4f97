#!/usr/bin/env bash
# The dashboard tests drive Debian's Chromium through Playwright (Playwright's own browser download is
# not used). Install the package when it is missing.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then exit 0; fi
if [ "$(id -u)" -ne 0 ]; then
  echo "Chromium is missing: install Debian's 'chromium' package (sudo apt-get install -y chromium)" >&2
  exit 1
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
test -x /usr/bin/chromium
