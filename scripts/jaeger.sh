#!/usr/bin/env bash
# Jaeger v2 for stormguard's tracing end-to-end test.
#
#   bash scripts/jaeger.sh build     build Jaeger once from tools/jaeger (cached outside the repo)
#   bash scripts/jaeger.sh start     build if needed, start it in the background, wait until it answers
#   bash scripts/jaeger.sh stop      stop the Jaeger that 'start' started
#   bash scripts/jaeger.sh run-e2e   start, run the e2e test (go test -tags e2e in examples/tracing, its own module), stop
#   bash scripts/jaeger.sh example   start, run examples/tracing exporting to it, leave Jaeger running
#   bash scripts/jaeger.sh tidy      go mod tidy -diff in tools/jaeger
#
# Jaeger is built from the Go module proxy at the version pinned in
# tools/jaeger/go.mod (its own module: the library's go.mod does not see it).
# The first build takes 8 to 14 minutes on two cores (489 s on an otherwise
# idle machine with empty Go caches, 813 s beside other builds), a rebuild with
# a warm Go build cache about 20 s; the binary (~120 MB) is
# cached in ${STORMGUARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/stormguard} and
# never committed. It runs with tools/jaeger/config.yaml: in-memory storage,
# OTLP/gRPC on 127.0.0.1:4317, the query HTTP API on 127.0.0.1:16686 (the
# module build has no UI assets: the HTTP API is what the test reads).
# Addresses can be moved with JAEGER_OTLP_GRPC, JAEGER_QUERY_HTTP and
# JAEGER_QUERY_GRPC (host:port, loopback).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
tooldir="$root/tools/jaeger"
state="$root/.cache/jaeger" # git-ignored: pid file and log
pidfile="$state/jaeger.pid"
logfile="$state/jaeger.log"
wait_s=${JAEGER_WAIT_S:-60}

export JAEGER_OTLP_GRPC=${JAEGER_OTLP_GRPC:-127.0.0.1:4317}
export JAEGER_QUERY_HTTP=${JAEGER_QUERY_HTTP:-127.0.0.1:16686}
export JAEGER_QUERY_GRPC=${JAEGER_QUERY_GRPC:-127.0.0.1:16685}

log() { printf 'jaeger.sh: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }
# shellcheck source=scripts/lib.sh
. "$root/scripts/lib.sh"

# The version pinned in tools/jaeger/go.mod and a hash of its go.sum name the
# cached binary, so any change of the tool module builds anew.
version=$(sed -n 's/^[[:space:]]*github.com\/jaegertracing\/jaeger \(v[^ ]*\).*/\1/p' "$tooldir/go.mod")
[ -n "$version" ] || die "no github.com/jaegertracing/jaeger requirement in $tooldir/go.mod"
sum=$(sha256sum "$tooldir/go.sum" | cut -c1-12)
bin="${STORMGUARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/stormguard}/jaeger-$version-$sum/jaeger"

build() {
  if [ -x "$bin" ]; then
    log "cached: $bin"
    return
  fi
  mkdir -p "$(dirname "$bin")"
  rm -f "$bin".tmp.* # left by an interrupted build
  log "building $version into $bin (a first build takes 8 to 14 minutes on two cores)"
  local start=$SECONDS
  if ! go -C "$tooldir" build -o "$bin.tmp.$$" github.com/jaegertracing/jaeger/cmd/jaeger; then
    rm -f "$bin.tmp.$$"
    die "building Jaeger failed"
  fi
  mv -f "$bin.tmp.$$" "$bin"
  log "built in $((SECONDS - start)) s"
}

# answers HOST:PORT: true when something accepts TCP connections there.
answers() {
  local host=${1%:*} port=${1##*:}
  (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null
}

# query_ok: true when the query API answers /api/services with 200.
query_ok() {
  local url="http://$JAEGER_QUERY_HTTP/api/services"
  if command -v curl >/dev/null; then
    curl -fsS -o /dev/null --max-time 2 "$url" 2>/dev/null
  else
    local host=${JAEGER_QUERY_HTTP%:*} port=${JAEGER_QUERY_HTTP##*:} status
    status=$(
      exec 3<>"/dev/tcp/$host/$port" || exit 1
      printf 'GET /api/services HTTP/1.0\r\nHost: %s\r\n\r\n' "$JAEGER_QUERY_HTTP" >&3
      timeout 2 head -n1 <&3
    ) 2>/dev/null || return 1
    [[ $status == *" 200 "* ]]
  fi
}

# ours PID: true when PID is a live Jaeger started from our binary.
ours() {
  local pid=$1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null &&
    [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$bin" ]
}

start() {
  build
  mkdir -p "$state"
  if [ -f "$pidfile" ] && ours "$(cat "$pidfile")"; then
    log "already running (pid $(cat "$pidfile"))"
    return
  fi
  local a
  for a in "$JAEGER_OTLP_GRPC" "$JAEGER_QUERY_HTTP" "$JAEGER_QUERY_GRPC"; do
    case ${a%:*} in
      127.* | localhost | "[::1]") ;;
      *) die "refusing non-loopback address $a" ;;
    esac
    if answers "$a"; then
      die "$a is already in use by another process; set JAEGER_OTLP_GRPC / JAEGER_QUERY_HTTP / JAEGER_QUERY_GRPC to free loopback ports"
    fi
  done
  log "starting $bin (log: $logfile)"
  "$bin" --config "$tooldir/config.yaml" </dev/null >"$logfile" 2>&1 &
  local pid=$!
  echo "$pid" >"$pidfile"
  local deadline=$((SECONDS + wait_s)) t0=$SECONDS
  until query_ok && answers "$JAEGER_OTLP_GRPC"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 30 "$logfile" >&2 || true
      rm -f "$pidfile"
      die "Jaeger exited during start-up (log above)"
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      tail -n 30 "$logfile" >&2 || true
      stop
      die "Jaeger did not answer within ${wait_s}s"
    fi
    sleep 0.2
  done
  log "ready in $((SECONDS - t0)) s: OTLP/gRPC $JAEGER_OTLP_GRPC, query http://$JAEGER_QUERY_HTTP (pid $pid)"
}

stop() {
  stop_pid "$pidfile"
  rm -f "$pidfile"
}

run_e2e() {
  start
  trap stop EXIT
  if ! JAEGER_QUERY_URL="http://$JAEGER_QUERY_HTTP" \
    OTEL_EXPORTER_OTLP_ENDPOINT="http://$JAEGER_OTLP_GRPC" \
    go -C "$root/examples/tracing" test -tags e2e -count=1 -run 'TestJaegerE2E' -v .; then
    log "e2e failed; the end of Jaeger's log ($logfile):"
    tail -n 40 "$logfile" >&2 || true
    exit 1
  fi
  log "e2e passed; $SECONDS s in all (build included)"
}

# example: start Jaeger, run examples/tracing exporting to it, and leave
# Jaeger running so its API can be read; 'stop' stops it.
example() {
  start
  OTEL_EXPORTER_OTLP_ENDPOINT="http://$JAEGER_OTLP_GRPC" go -C "$root/examples/tracing" run .
  log "traces: curl -s 'http://$JAEGER_QUERY_HTTP/api/traces?service=stormguard-example&limit=20'"
  log "stop Jaeger with: bash scripts/jaeger.sh stop"
}

case ${1:-} in
  build) build ;;
  start) start ;;
  stop) stop ;;
  run-e2e) run_e2e ;;
  example) example ;;
  tidy) go -C "$tooldir" mod tidy -diff ;;
  *) die "usage: $0 {build|start|stop|run-e2e|example|tidy}" ;;
esac
