#!/usr/bin/env bash
# Installs the Debian packages the test suite needs beyond Python: a headless Chromium and its WebDriver, which the
# browser tests (tests/test_browser.py) drive through Selenium, and pango, which WeasyPrint (the pdf extra:
# `conclave export --format pdf`, tests/test_export.py) loads. Idempotent; needs root (or sudo) and apt.
set -euo pipefail

if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 \
    && ldconfig -p 2>/dev/null | grep -q 'libpangoft2-1.0.so.0'; then
  echo "system deps: chromium, chromedriver and pango already installed"
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "system deps: not root and no sudo; cannot install chromium (browser tests will be skipped)" >&2
    exit 0
  fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "system deps: no apt-get on this system; install chromium and chromedriver yourself" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver fonts-dejavu-core \
  libpango-1.0-0 libpangoft2-1.0-0 >/dev/null
echo "system deps: $(chromium --version 2>/dev/null || echo 'chromium ?'); $(chromedriver --version 2>/dev/null | head -1)"
