#!/usr/bin/env bash
# install-os-package.sh COMMAND DEBIAN_PACKAGE [RPM_PACKAGE] [BREW_FORMULA]
#   Installs COMMAND from the OS packages when it is not on PATH (apt, dnf or
#   Homebrew); does nothing when it is there. Used by `make setup` (Redis) and
#   `make test` (Chromium for the status page tests, Node.js, Prometheus).
# install-os-package.sh --plan COMMAND=DEBIAN_PACKAGE ...
#   Installs nothing: prints what the install of each missing COMMAND would
#   bring (packages and size, from apt's lists when it has them).
#
# It leaves the machine as it found it, but for the files: nothing a package
# installs is left running or started at boot. On Debian and Ubuntu a
# temporary policy-rc.d (exit 101) keeps apt from starting any service
# during the install, and then every systemd unit and init script that the
# newly installed packages (the package and what it pulled in) shipped is
# disabled (`systemctl disable --now`, `update-rc.d NAME disable`), e.g.
# Debian's prometheus.service and redis-server.service. An existing
# policy-rc.d (a container image's) is left as it is. dnf does not enable
# a package's services (presets) and Homebrew starts none.
#
# Tests point POLICY_RC_D at a scratch file and put fake apt-get, dpkg,
# dpkg-query and systemctl first on PATH (tests/unit/test_install_scripts.py).
set -euo pipefail
POLICY_RC_D=${POLICY_RC_D:-/usr/sbin/policy-rc.d}
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

plan() {
  local missing=0 pair command_name debian names kb count
  for pair in "$@"; do
    command_name=${pair%%=*} debian=${pair#*=}
    if command -v "$command_name" >/dev/null 2>&1; then continue; fi
    missing=1
    if command -v apt-get >/dev/null 2>&1 && command -v apt-cache >/dev/null 2>&1; then
      names=$(apt-get -s -qq install --no-install-recommends "$debian" 2>/dev/null | awk '/^Inst /{print $2}' || true)
      if [ -n "$names" ]; then
        # shellcheck disable=SC2086 # one word per package
        kb=$(apt-cache show --no-all-versions $names 2>/dev/null | awk '/^Installed-Size:/{s += $2} END {print s + 0}')
        count=$(echo "$names" | wc -l)
        echo "  $debian (for $command_name): $count Debian packages, about $((kb / 1024)) MB installed"
        continue
      fi
    fi
    echo "  $debian (for $command_name): size not known here (apt's package lists are fetched first: apt-get update)"
  done
  if [ "$missing" -eq 0 ]; then echo "  no OS package: every command needed is installed"; fi
}

installed_packages() {
  dpkg-query -W -f '${Package}\n' 2>/dev/null | sort
}

# Units and init scripts shipped by the packages named on stdin.
shipped_services() {
  local package
  while read -r package; do
    [ -n "$package" ] || continue
    dpkg -L "$package" 2>/dev/null |
      grep -E '^(/usr)?/lib/systemd/system/[^/]+\.(service|socket|timer|path)$|^/etc/init\.d/[^/]+$' |
      sed "s|^|$package |" || true
  done
}

disable_services() {
  local package path unit systemd_running=0
  if [ -d /run/systemd/system ]; then systemd_running=1; fi
  while read -r package path; do
    unit=${path##*/}
    case "$path" in
      /etc/init.d/*)
        if command -v update-rc.d >/dev/null 2>&1; then
          $SUDO update-rc.d "$unit" disable >/dev/null 2>&1 || true
          echo "disabled init script $unit (from $package): it does not start at boot" >&2
        fi
        ;;
      *)
        if ! command -v systemctl >/dev/null 2>&1; then continue; fi
        case "$unit" in *@.*) continue ;; esac # templates: only their instances are ever enabled
        if [ "$systemd_running" -eq 1 ]; then
          $SUDO systemctl disable --now --quiet "$unit" >/dev/null 2>&1 || true
        else # no systemd running (a container): only the boot links exist to remove
          $SUDO systemctl disable --quiet "$unit" >/dev/null 2>&1 || true
        fi
        echo "disabled $unit (from $package): not running, not started at boot" >&2
        ;;
    esac
  done
}

install_debian() {
  local debian=$1 before after placed=0
  before=$(installed_packages)
  if [ ! -e "$POLICY_RC_D" ]; then
    printf '#!/bin/sh\n# plancache scripts/install-os-package.sh: no service starts during this install\nexit 101\n' |
      $SUDO tee "$POLICY_RC_D" >/dev/null
    $SUDO chmod 755 "$POLICY_RC_D"
    placed=1
    trap '$SUDO rm -f "$POLICY_RC_D"' EXIT
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$debian" >/dev/null
  after=$(installed_packages)
  if [ -z "$before" ] || [ -z "$after" ]; then # dpkg-query did not answer: the named package's own services
    echo "$debian" | shipped_services | disable_services
  else
    comm -13 <(echo "$before") <(echo "$after") | shipped_services | disable_services
  fi
  if [ "$placed" -eq 1 ]; then
    $SUDO rm -f "$POLICY_RC_D"
    trap - EXIT
  fi
}

if [ "${1:-}" = "--plan" ]; then
  shift
  plan "$@"
  exit 0
fi

command_name=$1 debian=$2 rpm=${3:-$2} brew=${4:-$2}
if command -v "$command_name" >/dev/null 2>&1; then
  exit 0
fi
echo "installing $command_name from the OS packages ($debian)" >&2
if command -v apt-get >/dev/null 2>&1; then
  install_debian "$debian"
elif command -v dnf >/dev/null 2>&1; then
  $SUDO dnf install -y -q "$rpm"
elif command -v brew >/dev/null 2>&1; then
  brew install "$brew"
else
  echo "$command_name is missing and no known package manager was found: install it ($debian)" >&2
  exit 1
fi
command -v "$command_name" >/dev/null
