#!/usr/bin/env bash
# Fetches the JVM packages pinned in tools/jars/pom.xml from Maven Central into the
# user-level cache (keyed by the pom's hash), drops every artifact that pyspark already
# ships (one version of each class on the classpath), and links the result to .cache/jars.
# Usage: tools/jars/install.sh PYSPARK_JARS_DIR
set -euo pipefail

top=$(cd "$(dirname "$0")/../.." && pwd)
pyspark_jars=${1:?usage: install.sh PYSPARK_JARS_DIR}
cache=${PP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/persistent-pipelines}
key=$(cat "$top/tools/jars/pom.xml" "$0" "$top/tools/jars/maven.sh" | sha256sum | cut -c1-16)
out="$cache/jars/$key"

# shellcheck source=tools/jars/maven.sh
. "$top/tools/jars/maven.sh"

if [ ! -f "$out/.complete" ]; then
  command -v java >/dev/null 2>&1 || { echo "error: Java 17 is needed to fetch Spark's JVM packages (and to run Spark)." >&2; exit 1; }
  mvn=$(maven)
  echo ">>> fetching Delta Lake, hadoop-aws, the AWS SDK bundle, spark-hadoop-cloud and the Kafka connector from Maven Central (about 700 MB, first time only)"
  rm -rf "$out.tmp"
  "$mvn" -B -q -f "$top/tools/jars/pom.xml" dependency:copy-dependencies \
      -DincludeScope=runtime -DoutputDirectory="$out.tmp"
  for jar in "$out.tmp"/*.jar; do
    artifact=$(basename "$jar" .jar | sed -E 's/-[0-9][0-9A-Za-z.]*([-.][0-9A-Za-z]+)*$//')
    if compgen -G "$pyspark_jars/$artifact-[0-9]*.jar" >/dev/null; then
      rm "$jar"
    fi
  done
  touch "$out.tmp/.complete"
  rm -rf "$out" && mv "$out.tmp" "$out"
  echo ">>> kept $(ls "$out"/*.jar | wc -l) jars not already in pyspark: $(du -sh "$out" | cut -f1)"
fi
mkdir -p "$top/.cache"
ln -sfn "$out" "$top/.cache/jars"
