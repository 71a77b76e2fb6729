# Maven itself, pinned, for the install scripts that fetch JVM packages (sourced by
# tools/jars/install.sh and tools/kafka/install.sh): the machine's own mvn if it is this
# version (as in the Dockerfile's build stage), else fetched once from Maven Central into
# the cache and checked against this SHA-512, so the machine needs only Java and Python.
# Expects $cache (the user-level cache folder).

maven_version=3.9.11
maven_sha512=bcfe4fe305c962ace56ac7b5fc7a08b87d5abd8b7e89027ab251069faebee516b0ded8961445d6d91ec1985dfe30f8153268843c89aa392733d1a3ec956c9978
maven_home="$cache/maven-$maven_version"

# One script using Maven at a time per cache: both fetch Maven itself into the same folder
# and write the same local repository (~/.m2), and `make setup` runs them in parallel.
mkdir -p "$cache"
exec 8> "$cache/.maven.lock"
flock 8

# maven: prints the path of the pinned mvn, fetching it first if need be.
maven() {
  # Read whole, not piped to grep -q: under pipefail, grep leaving early could fail the check.
  if command -v mvn >/dev/null 2>&1 && [[ "$(mvn -B -v 2>/dev/null || true)" == "Apache Maven $maven_version "* ]]; then
    command -v mvn
    return
  fi
  [ -x "$maven_home/bin/mvn" ] || install_maven >&2
  echo "$maven_home/bin/mvn"
}

install_maven() {
  local url="https://repo.maven.apache.org/maven2/org/apache/maven/apache-maven/$maven_version/apache-maven-$maven_version-bin.tar.gz"
  echo ">>> fetching Maven $maven_version into $maven_home (first time only)"
  rm -rf "$maven_home.tmp" && mkdir -p "$maven_home.tmp"
  python3 -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' \
      "$url" "$maven_home.tmp/maven.tar.gz"
  echo "$maven_sha512  $maven_home.tmp/maven.tar.gz" | sha512sum --check --quiet - || {
    echo "error: $url does not match the SHA-512 pinned in ${BASH_SOURCE[0]}" >&2
    exit 1
  }
  tar -xzf "$maven_home.tmp/maven.tar.gz" -C "$maven_home.tmp" --strip-components=1
  rm "$maven_home.tmp/maven.tar.gz"
  rm -rf "$maven_home" && mv "$maven_home.tmp" "$maven_home"
}
