#!/usr/bin/env bash
# Fetches the Kafka broker pinned in tools/kafka/pom.xml (server, storage tool, admin tools
# and their dependencies) from Maven Central into the user-level cache, keyed by the pom's
# hash, and links the result to .cache/kafka. localcluster/kafka.py runs the broker from it.
# Usage: tools/kafka/install.sh
set -euo pipefail

top=$(cd "$(dirname "$0")/../.." && pwd)
cache=${PP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/persistent-pipelines}
key=$(cat "$top/tools/kafka/pom.xml" "$0" "$top/tools/jars/maven.sh" | sha256sum | cut -c1-16)
out="$cache/kafka/$key"

# shellcheck source=tools/jars/maven.sh
. "$top/tools/jars/maven.sh"

if [ ! -f "$out/.complete" ]; then
  command -v java >/dev/null 2>&1 || { echo "error: Java 17 is needed to fetch and run the Kafka broker." >&2; exit 1; }
  mvn=$(maven)
  echo ">>> fetching the Kafka broker from Maven Central (about 45 MB, first time only)"
  rm -rf "$out.tmp"
  "$mvn" -B -q -f "$top/tools/kafka/pom.xml" dependency:copy-dependencies \
      -DincludeScope=runtime -DoutputDirectory="$out.tmp"
  touch "$out.tmp/.complete"
  rm -rf "$out" && mv "$out.tmp" "$out"
  echo ">>> Kafka broker ready: $(ls "$out"/*.jar | wc -l) jars, $(du -sh "$out" | cut -f1)"
fi
mkdir -p "$top/.cache"
ln -sfn "$out" "$top/.cache/kafka"
