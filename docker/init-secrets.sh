#!/usr/bin/env bash
# docker/init-secrets.sh [FOLDER]: what docker-compose.yml needs before the first
# `docker compose up`, made with openssl (no Python needed), in FOLDER (default:
# the repository root). Files that exist are kept, so running it again changes nothing.
#   .env                          PLANCACHE_REDIS_PASSWORD: a random password for Redis (any other
#                                 password works too: the server puts it into its URL quoted)
#   secrets/tokens                a `compile` and an `admin` bearer token: the gRPC port refuses
#                                 callers without one (clients: PLANCACHE_TOKEN or Client(token=...))
#   secrets/plan-signing.pem      the workers' Ed25519 signing key (private, mode 0600)
#   secrets/plan-signing.pub.pem  the key every client trusts: copy it, or `plancache trust HOST:PORT`
set -euo pipefail
folder=${1:-"$(cd "$(dirname "$0")/.." && pwd)"}
umask 077
mkdir -p "$folder/secrets"
random() { openssl rand -hex "$1"; }
if ! grep -qs '^PLANCACHE_REDIS_PASSWORD=' "$folder/.env"; then
  echo "PLANCACHE_REDIS_PASSWORD=$(random 24)" >>"$folder/.env"
  echo "wrote PLANCACHE_REDIS_PASSWORD to $folder/.env"
fi
if [ ! -e "$folder/secrets/tokens" ]; then
  printf 'compile %s\nadmin %s\n' "$(random 24)" "$(random 24)" >"$folder/secrets/tokens"
  echo "wrote a compile and an admin token to $folder/secrets/tokens"
fi
if [ ! -e "$folder/secrets/plan-signing.pem" ]; then
  openssl genpkey -algorithm ed25519 -out "$folder/secrets/plan-signing.pem"
  openssl pkey -in "$folder/secrets/plan-signing.pem" -pubout -out "$folder/secrets/plan-signing.pub.pem"
  chmod 644 "$folder/secrets/plan-signing.pub.pem"
  echo "wrote the plan-signing key $folder/secrets/plan-signing.pem; clients trust $folder/secrets/plan-signing.pub.pem"
fi
