#!/usr/bin/env bash
# install-os-package.sh COMMAND DEBIAN_PACKAGE [RPM_PACKAGE] [BREW_FORMULA]
# Installs COMMAND from the OS packages when it is not on PATH (apt, dnf or
# Homebrew); does nothing when it is there. Used by `make setup` (Redis) and
# `make test` (Chromium for the status page tests, Node.js, Prometheus).
set -euo pipefail
command_name=$1 debian=$2 rpm=${3:-$2} brew=${4:-$2}
if command -v "$command_name" >/dev/null 2>&1; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "installing $command_name from the OS packages" >&2
if command -v apt-get >/dev/null 2>&1; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$debian" >/dev/null
elif command -v dnf >/dev/null 2>&1; then
  $SUDO dnf install -y -q "$rpm"
elif command -v brew >/dev/null 2>&1; then
  brew install "$brew"
else
  echo "$command_name is missing and no known package manager was found: install it ($debian)" >&2
  exit 1
fi
command -v "$command_name" >/dev/null
