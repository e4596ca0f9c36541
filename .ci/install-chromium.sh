#!/usr/bin/env bash
# Install headless Chromium (Debian package "chromium") for the browser tests
# (tests/browser/) when it is missing. Never fatal: without Chromium they skip and say why.
set -u
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-chromium: no apt-get here; the browser test will skip"
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO="sudo -n"
    else
        echo "install-chromium: not root and no sudo; the browser test will skip"
        exit 0
    fi
fi
export DEBIAN_FRONTEND=noninteractive
if $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q chromium >/dev/null; then
    echo "install-chromium: installed $(chromium --version 2>/dev/null)"
else
    echo "install-chromium: apt-get could not install chromium; the browser test will skip"
fi
exit 0
