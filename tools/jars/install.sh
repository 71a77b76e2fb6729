#!/usr/bin/env bash
# Fetches the JVM packages pinned in tools/jars/pom.xml from Maven Central into the
# user-level cache (keyed by the hash of the pom, this script and tools/jars/java), drops
# every artifact that pyspark already ships (one version of each class on the classpath),
# compiles the project's own classes (tools/jars/java: Delta's LogStore for S3) against the
# result and pyspark's jars, and links the folder to .cache/jars.
# Usage: tools/jars/install.sh PYSPARK_JARS_DIR
set -euo pipefail

top=$(cd "$(dirname "$0")/../.." && pwd)
pyspark_jars=${1:?usage: install.sh PYSPARK_JARS_DIR}
cache=${PP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/persistent-pipelines}
sources=$(cd "$top/tools/jars/java" && find . -name '*.java' | LC_ALL=C sort)
key=$( { cat "$top/tools/jars/pom.xml" "$0" "$top/tools/jars/maven.sh"; (cd "$top/tools/jars/java" && cat $sources); } \
       | sha256sum | cut -c1-16)
out="$cache/jars/$key"

# shellcheck source=tools/jars/maven.sh
. "$top/tools/jars/maven.sh"

# compile DIR: compiles tools/jars/java into DIR/spark-app-jvm.jar with the JDK's javac,
# which must be 17 (Spark 4.1's own), against the jars in DIR and pyspark's.
compile() {
  local dir=$1 version
  version=$(javac -version 2>&1 || true)
  [[ "$version" == "javac 17."* ]] || {
    echo "error: a JDK 17 javac is needed to compile tools/jars/java (found: ${version:-none})." >&2
    exit 1
  }
  echo ">>> compiling tools/jars/java with $version"
  rm -rf "$dir/classes"
  (cd "$top/tools/jars/java" && javac --release 17 -Xlint:all,-path -Werror -encoding UTF-8 \
      -cp "$dir/*:$pyspark_jars/*" -d "$dir/classes" $sources)
  # Fixed entry times: the same sources give the same jar.
  jar --create --file "$dir/spark-app-jvm.jar" --date=2000-01-01T00:00:00Z -C "$dir/classes" .
  rm -rf "$dir/classes"
}

if [ ! -f "$out/.complete" ]; then
  command -v java >/dev/null 2>&1 || { echo "error: Java 17 is needed to fetch Spark's JVM packages (and to run Spark)." >&2; exit 1; }
  mvn=$(maven)
  echo ">>> fetching Delta Lake, hadoop-aws, the AWS SDK bundle, spark-hadoop-cloud and the Kafka connector from Maven Central (about 700 MB, first time only)"
  rm -rf "$out.tmp"
  # A failed fetch or compile leaves no 700 MB half-folder behind.
  trap 'rm -rf "$out.tmp"' EXIT
  "$mvn" -B -q -f "$top/tools/jars/pom.xml" dependency:copy-dependencies \
      -DincludeScope=runtime -DoutputDirectory="$out.tmp"
  for jar in "$out.tmp"/*.jar; do
    artifact=$(basename "$jar" .jar | sed -E 's/-[0-9][0-9A-Za-z.]*([-.][0-9A-Za-z]+)*$//')
    if compgen -G "$pyspark_jars/$artifact-[0-9]*.jar" >/dev/null; then
      rm "$jar"
    fi
  done
  compile "$out.tmp"
  touch "$out.tmp/.complete"
  rm -rf "$out" && mv "$out.tmp" "$out"
  echo ">>> kept $(ls "$out"/*.jar | wc -l) jars not already in pyspark: $(du -sh "$out" | cut -f1)"
fi
mkdir -p "$top/.cache"
ln -sfn "$out" "$top/.cache/jars"
