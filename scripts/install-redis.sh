#!/usr/bin/env bash
# Installs redis-server from the OS packages when it is missing. The server
# starts its own private instance; nothing is enabled as a system service.
set -euo pipefail
cd "$(dirname "$0")"
if command -v redis-server >/dev/null 2>&1; then
  exit 0
fi
./install-os-package.sh redis-server redis-server redis redis
# Debian starts a system instance on 6379 on install; we do not use it.
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
($SUDO systemctl disable --now redis-server >/dev/null 2>&1 || $SUDO service redis-server stop >/dev/null 2>&1 || true)
