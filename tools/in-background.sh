#!/usr/bin/env bash
# Runs a set-up step in the background while other work goes on, then joins it.
#
#   tools/in-background.sh start NAME COMMAND...   starts COMMAND at the lowest CPU priority
#   tools/in-background.sh wait NAME               shows its output, waits, exits with its status
#
# `make test` builds the control plane's binaries this way while the stages that do not
# need them run: from an empty cache the Go builds take about 9 minutes of the 2 cores,
# which the Spark stage, mostly waiting on JVMs and batches, leaves partly idle. At the
# lowest priority the build takes only what the tests leave, so their timing is not squeezed.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
run="$top/.cache/background"
mkdir -p "$run"

action=${1:?usage: in-background.sh start NAME COMMAND... | wait NAME}
name=${2:?a name for the background step}
log="$run/$name.log" status="$run/$name.status" pid_file="$run/$name.pid"

case $action in
  start)
    shift 2
    rm -f "$status"
    : > "$log"
    # The status is written by the subshell, so that `wait` reads it in another shell; no
    # descriptor of the caller stays open in it (a pipe reading `make test` would wait for it).
    ( set +e; nice -n 19 "$@"; echo $? > "$status" ) >> "$log" 2>&1 < /dev/null &
    echo $! > "$pid_file"
    echo ">>> started in the background (log: ${log#"$top"/}): $*"
    ;;
  wait)
    [ -f "$pid_file" ] || { echo "error: nothing named $name was started in the background" >&2; exit 1; }
    echo ">>> waiting for $name (started in the background); its output so far, then as it comes:"
    tail -n +1 -f --pid="$(cat "$pid_file")" "$log"
    [ -f "$status" ] || { echo "error: $name ended without an exit status (killed?)" >&2; exit 1; }
    code=$(cat "$status")
    rm -f "$pid_file"
    [ "$code" = 0 ] || { echo "error: $name failed (exit code $code)" >&2; exit "$code"; }
    ;;
  *)
    echo "usage: in-background.sh start NAME COMMAND... | wait NAME" >&2
    exit 2
    ;;
esac
