#!/usr/bin/env bash
# Debian's headless Chromium and its WebDriver, for the web chat's browser test
# (tests/python/web/test_browser.py). Idempotent: nothing happens when both are there; it says
# what it installs before it does.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo ".ci/browser-deps.sh: chromium and chromium-driver are missing; install them as root (apt-get install chromium chromium-driver)" >&2
  exit 1
fi
echo ".ci/browser-deps.sh: installing Debian's chromium and chromium-driver (apt-get install), for tests/python/web/test_browser.py" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
