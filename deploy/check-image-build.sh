#!/usr/bin/env bash
# Checks the Dockerfile's build without a Docker engine: runs the same cargo build natively for
# x86_64-unknown-linux-musl, checks that the binary is static (it must run in an empty image),
# then runs it as the image would, `tenure elect` with leader-elector:0.5's arguments, and checks
# the HTTP answers the example manifest's probes rely on and the release on SIGTERM.
#
# Usage: deploy/check-image-build.sh [--require-musl]
#
# Installs nothing. Without the musl target (`rustup target add x86_64-unknown-linux-musl`, and
# Debian's musl-tools for crates that compile C) the musl build is skipped with a note and the
# run check uses a host build; --require-musl makes that skip a failure instead.
set -euo pipefail

TARGET=x86_64-unknown-linux-musl
require_musl=false
case "${1:-}" in
  --require-musl) require_musl=true ;;
  "") ;;
  *) echo "usage: $0 [--require-musl]" >&2; exit 2 ;;
esac

cd "$(dirname "$0")/.."
say() { printf 'check-image-build: %s\n' "$*"; }

if rustup target list --installed 2>/dev/null | grep -qx "$TARGET"; then
  say "building as the Dockerfile does (target $TARGET)"
  cargo build --profile sidecar --locked --target "$TARGET" --bin tenure -p tenure-cli
  binary="target/$TARGET/sidecar/tenure"
  # Static means: no program interpreter and no shared libraries needed.
  if readelf -l "$binary" | grep -q 'INTERP' || readelf -d "$binary" | grep -q 'NEEDED'; then
    say "FAILED: $binary is dynamically linked; it would not start in a FROM scratch image" >&2
    readelf -d "$binary" | grep NEEDED >&2 || true
    exit 1
  fi
  say "static binary: $binary ($(du -h "$binary" | cut -f1))"
  built="musl"
else
  if $require_musl; then
    say "FAILED: the $TARGET target is not installed (rustup target add $TARGET)" >&2
    exit 1
  fi
  say "SKIPPED the musl build: the $TARGET target is not installed" \
    "(rustup target add $TARGET; apt-get install musl-tools). Checking a host build instead."
  cargo build --profile sidecar --locked --bin tenure -p tenure-cli
  binary="target/sidecar/tenure"
  built="host (musl skipped)"
fi

# Run it as the image does: ENTRYPOINT ["/tenure", "elect"] followed by the old image's args.
# The lock is an explicit file lock, so the check needs no cluster.
work=$(mktemp -d)
pid=""
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
base="http://127.0.0.1:$port"

"$binary" elect \
  --election=kuryr-controller --http="127.0.0.1:$port" --election-namespace=kube-system --ttl=5s \
  --id=check-0 --lock="file://$work/lock.json" 2>"$work/stderr" &
pid=$!

answer=""
for _ in $(seq 1 100); do
  answer=$(curl -fsS "$base/" 2>/dev/null || true)
  [ "$answer" = '{"name":"check-0"}' ] && break
  sleep 0.1
done
if [ "$answer" != '{"name":"check-0"}' ]; then
  say "FAILED: GET / answered '$answer', expected {\"name\":\"check-0\"}" >&2
  cat "$work/stderr" >&2
  exit 1
fi
for path in /healthz /readyz; do
  if ! curl -fsS -o /dev/null "$base$path"; then
    say "FAILED: GET $path did not answer 2xx" >&2
    exit 1
  fi
done
is_leader=$(curl -fsS "$base/isLeader")
if [ "$is_leader" != '{"isLeader":true}' ]; then
  say "FAILED: GET /isLeader answered '$is_leader'" >&2
  exit 1
fi

kill -TERM "$pid"
status=0
wait "$pid" || status=$?
pid=""
if [ "$status" -ne 0 ]; then
  say "FAILED: tenure elect exited with status $status after SIGTERM, expected 0 (lock released)" >&2
  cat "$work/stderr" >&2
  exit 1
fi

say "OK: build $built; elect with leader-elector:0.5's args answered /, /healthz, /readyz," \
  "/isLeader and released the lock on SIGTERM"
