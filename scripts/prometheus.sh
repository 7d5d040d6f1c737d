#!/usr/bin/env bash
# Prometheus for stormguard's metrics end-to-end test and examples/metrics.
#
#   bash scripts/prometheus.sh install    apt-get install Debian's prometheus (and curl) if missing (root; idempotent)
#   bash scripts/prometheus.sh start      start it in the background on a free loopback port, wait until ready
#   bash scripts/prometheus.sh stop       stop the Prometheus that 'start' started and remove its temp dir
#   bash scripts/prometheus.sh run-e2e    start, run the e2e test (go test -tags e2e in examples/metrics), stop
#   bash scripts/prometheus.sh query EXPR evaluate a PromQL expression now and print the JSON answer
#   bash scripts/prometheus.sh url        print the running Prometheus's base URL
#
# Prometheus is Debian's package (2.42 on bookworm), run as a plain process,
# never as the package's system service: 'start' writes a config into a new
# temp dir, keeps the TSDB there, and listens on PROMETHEUS_ADDR (default: the
# first free port of 127.0.0.1:9090-9099). It scrapes every second the
# targets listed in targets.json of that dir (file-based service discovery,
# picked up within about 5 s of a change); 'start' writes
# STORMGUARD_METRICS_ADDR (default 127.0.0.1:9464, where examples/metrics
# serves /metrics) there, and the e2e test rewrites it with the address its
# example listens on. The job is named stormguard-example.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
state="$root/.cache/prometheus" # git-ignored: pid, address and temp dir of the running Prometheus
pidfile="$state/prometheus.pid"
addrfile="$state/addr"
dirfile="$state/dir"
wait_s=${PROMETHEUS_WAIT_S:-60}
metrics_addr=${STORMGUARD_METRICS_ADDR:-127.0.0.1:9464}

log() { printf 'prometheus.sh: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }
# shellcheck source=scripts/lib.sh
. "$root/scripts/lib.sh"

install() {
  local pkgs=()
  command -v prometheus >/dev/null || pkgs+=(prometheus)
  command -v curl >/dev/null || pkgs+=(curl)
  if [ ${#pkgs[@]} -eq 0 ]; then
    log "installed: $(prometheus --version 2>&1 | head -n1)"
    return
  fi
  [ "$(id -u)" = 0 ] || die "${pkgs[*]} missing; as root: apt-get update && apt-get install -y --no-install-recommends ${pkgs[*]}"
  log "installing Debian's ${pkgs[*]}"
  local t0=$SECONDS out
  out=$(mktemp)
  # --no-install-recommends: no node exporter. The package's service is not
  # used (and, without systemd, not started). Output only on failure.
  if ! { DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}"; } >"$out" 2>&1; then
    cat "$out" >&2
    rm -f "$out"
    die "installing ${pkgs[*]} failed"
  fi
  rm -f "$out"
  log "installed in $((SECONDS - t0)) s: $(prometheus --version 2>&1 | head -n1)"
}

# answers HOST:PORT: true when something accepts TCP connections there.
answers() {
  local host=${1%:*} port=${1##*:}
  (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null
}

# http_ok URL: true when URL answers 200.
http_ok() { curl -fsS -o /dev/null --max-time 2 "$1" 2>/dev/null; }

# ours PID: true when PID is a live prometheus process.
ours() {
  local pid=$1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null &&
    [ "$(basename "$(readlink "/proc/$pid/exe" 2>/dev/null)")" = prometheus ]
}

running() { [ -f "$pidfile" ] && ours "$(cat "$pidfile")"; }

url() {
  running || die "not running: bash scripts/prometheus.sh start"
  echo "http://$(cat "$addrfile")"
}

pick_addr() {
  if [ -n "${PROMETHEUS_ADDR:-}" ]; then
    case ${PROMETHEUS_ADDR%:*} in
      127.* | localhost) ;;
      *) die "refusing non-loopback address $PROMETHEUS_ADDR" ;;
    esac
    answers "$PROMETHEUS_ADDR" && die "$PROMETHEUS_ADDR is already in use; set PROMETHEUS_ADDR to a free loopback host:port"
    echo "$PROMETHEUS_ADDR"
    return
  fi
  local port
  for port in $(seq 9090 9099); do
    if ! answers "127.0.0.1:$port"; then
      echo "127.0.0.1:$port"
      return
    fi
  done
  die "no free port in 127.0.0.1:9090-9099; set PROMETHEUS_ADDR"
}

start() {
  command -v prometheus >/dev/null || die "prometheus is not installed: bash scripts/prometheus.sh install (as root)"
  command -v curl >/dev/null || die "curl is needed"
  mkdir -p "$state"
  if running; then
    log "already running (pid $(cat "$pidfile")) at http://$(cat "$addrfile")"
    return
  fi
  local addr dir
  addr=$(pick_addr)
  dir=$(mktemp -d "${TMPDIR:-/tmp}/stormguard-prometheus.XXXXXX")
  cat >"$dir/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: stormguard-example
    file_sd_configs:
      - files: ["$dir/targets.json"]
        refresh_interval: 1s
EOF
  printf '[{"targets": ["%s"]}]\n' "$metrics_addr" >"$dir/targets.json"
  log "starting $(command -v prometheus) on $addr (dir: $dir)"
  prometheus \
    --config.file="$dir/prometheus.yml" \
    --storage.tsdb.path="$dir/data" \
    --storage.tsdb.retention.time=1d \
    --web.listen-address="$addr" \
    </dev/null >"$dir/prometheus.log" 2>&1 &
  local pid=$!
  echo "$pid" >"$pidfile"
  echo "$addr" >"$addrfile"
  echo "$dir" >"$dirfile"
  local deadline=$((SECONDS + wait_s)) t0=$SECONDS
  until http_ok "http://$addr/-/ready"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 30 "$dir/prometheus.log" >&2 || true
      cleanup
      die "Prometheus exited during start-up (log above)"
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      tail -n 30 "$dir/prometheus.log" >&2 || true
      stop
      die "Prometheus was not ready within ${wait_s}s"
    fi
    sleep 0.2
  done
  log "ready in $((SECONDS - t0)) s: http://$addr (pid $pid), scraping $metrics_addr every second"
}

cleanup() {
  local dir
  dir=$(cat "$dirfile" 2>/dev/null || true)
  case $dir in
    "${TMPDIR:-/tmp}"/stormguard-prometheus.*) rm -rf "$dir" ;;
  esac
  rm -f "$pidfile" "$addrfile" "$dirfile"
}

stop() {
  stop_pid "$pidfile"
  cleanup
}

run_e2e() {
  start
  trap stop EXIT
  local base dir
  base="http://$(cat "$addrfile")"
  dir=$(cat "$dirfile")
  if ! PROMETHEUS_URL="$base" PROMETHEUS_TARGETS_FILE="$dir/targets.json" \
    go -C "$root/examples/metrics" test -tags e2e -count=1 -run 'TestPrometheusE2E' -v .; then
    log "e2e failed; the end of Prometheus's log:"
    tail -n 40 "$dir/prometheus.log" >&2 || true
    exit 1
  fi
  log "e2e passed; $SECONDS s in all"
}

query() {
  [ $# -eq 1 ] || die "usage: $0 query 'PROMQL'"
  curl -fsS --max-time 10 "$(url)/api/v1/query" --data-urlencode "query=$1"
  echo
}

case ${1:-} in
  install) install ;;
  start) start ;;
  stop) stop ;;
  run-e2e) run_e2e ;;
  query) shift; query "$@" ;;
  url) url ;;
  *) die "usage: $0 {install|start|stop|run-e2e|query EXPR|url}" ;;
esac
