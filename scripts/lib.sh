# Shell functions shared by jaeger.sh and prometheus.sh, which source this
# file after defining log (one line to stderr) and ours PID (whether PID is
# the backend the script started).

# stop_pid PIDFILE stops the backend whose pid PIDFILE holds, if it is ours:
# TERM, up to 20 s for it to exit, then KILL. It leaves PIDFILE in place.
stop_pid() {
  [ -f "$1" ] || return 0
  local pid i
  pid=$(cat "$1")
  ours "$pid" || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 200); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    log "pid $pid ignored TERM; killing"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  log "stopped (pid $pid)"
}
