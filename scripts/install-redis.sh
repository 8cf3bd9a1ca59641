#!/usr/bin/env bash
# Installs redis-server from the OS packages when it is missing. The server
# starts its own private instance; the system instance Debian's package
# would start on 6379 is neither started nor enabled (install-os-package.sh
# disables the units every package it installs ships).
set -euo pipefail
cd "$(dirname "$0")"
exec ./install-os-package.sh redis-server redis-server redis redis
