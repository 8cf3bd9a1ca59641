#!/usr/bin/env bash
# Installs redis-server from the OS packages when it is missing. The server
# starts its own private instance; nothing is enabled as a system service.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
if command -v apt-get >/dev/null 2>&1; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends redis-server >/dev/null
  # Debian starts a system instance on 6379 on install; we do not use it.
  ($SUDO systemctl disable --now redis-server >/dev/null 2>&1 || $SUDO service redis-server stop >/dev/null 2>&1 || true)
elif command -v dnf >/dev/null 2>&1; then
  $SUDO dnf install -y -q redis
elif command -v brew >/dev/null 2>&1; then
  brew install redis
else
  echo "redis-server is missing and no known package manager was found: install Redis 6.2 or newer" >&2
  exit 1
fi
command -v redis-server >/dev/null
