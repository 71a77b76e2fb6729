#!/usr/bin/env bash
# Builds the local control plane's binaries from the Go module proxy, pinned by the
# go.mod/go.sum files under tools/{kube,etcd,helm}:
#   kube-apiserver, kube-controller-manager, kubectl (Kubernetes v1.37.1), etcd (v3.6.8), helm (v4.3.1).
# Each tool set is built once per version into the user-level cache, keyed by a hash of
# its go.mod and go.sum, and linked into .cache/bin. A second run is a no-op.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
cache=${PP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/persistent-pipelines}
bin_links="$top/.cache/bin"
mkdir -p "$bin_links" "$cache/go"
# One build at a time per cache: two checkouts (or `make demo` beside `make test`) may ask
# for the same binaries at once, and would both write the same folder.
exec 9> "$cache/go/.build.lock"
flock 9

# No DWARF from the compiler: the linker strips it anyway (-s -w), and generating it cost
# a tenth to a sixth of a build from an empty Go cache (etcd, 5 alternated pairs: 0.75 to
# 1.04x, median 0.90; all three tools 636 s and 1,216 CPU s against 770 s and 1,458 the day before).
export GOFLAGS="-mod=mod -buildvcs=false -trimpath -gcflags=all=-dwarf=false"
export CGO_ENABLED=0
export GOTOOLCHAIN=local

need_go() {
  command -v go >/dev/null 2>&1 || {
    echo "error: Go is needed to build the local control plane (tools/*/go.mod); install Go >= 1.26." >&2
    exit 1
  }
}

# Stamps version information into Kubernetes binaries, as the upstream release build does,
# so that `kubectl version` and helm's kubeVersion checks see v1.37.1 instead of v0.0.0.
kube_ldflags() {
  local version major minor flags="-s -w"
  version=$(awk '$1 == "k8s.io/kubernetes" {print $2; exit}' "$top/tools/kube/go.mod")
  [[ $version =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "error: no k8s.io/kubernetes version in tools/kube/go.mod" >&2; exit 1; }
  major=${version#v}; major=${major%%.*}
  minor=${version#v*.}; minor=${minor%%.*}
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags="$flags -X $pkg.gitVersion=$version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    flags="$flags -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$flags"
}

# build NAME LDFLAGS BINARY=PACKAGE... : builds the packages pinned by tools/NAME into the
# cache and links each binary into .cache/bin (with several packages, each BINARY is its
# package's last path element, the name go build gives it).
build() {
  local name=$1 ldflags=$2; shift 2
  local dir="$top/tools/$name" key out
  # The key covers the pins and this script's commands (its flags), not its comments.
  key=$(cat "$dir/go.mod" "$dir/go.sum" <(grep -v -e '^[[:space:]]*#' -e '^[[:space:]]*$' "$0") | sha256sum | cut -c1-16)
  out="$cache/go/$name-$key"
  if [ ! -f "$out/.complete" ]; then
    need_go
    echo ">>> building $name into $out (first time only: several minutes on 2 cores)"
    local started=$SECONDS target packages=()
    rm -rf "$out.tmp" && mkdir -p "$out.tmp"
    for target in "$@"; do packages+=("${target#*=}"); done
    echo ">>>   go build ${packages[*]}"
    if [ $# -eq 1 ]; then
      (cd "$dir" && go build -ldflags "$ldflags" -o "$out.tmp/${1%%=*}" "${packages[0]}")
    else
      # One go command for the whole set: it links each binary while it compiles the
      # next one's packages, where one command per binary left a core idle during each link.
      # Go names each binary after its package's last element (checked below).
      (cd "$dir" && go build -ldflags "$ldflags" -o "$out.tmp/" "${packages[@]}")
      for target in "$@"; do
        [ -x "$out.tmp/${target%%=*}" ] || { echo "error: go build made no ${target%%=*} for ${target#*=}" >&2; exit 1; }
      done
    fi
    touch "$out.tmp/.complete"
    rm -rf "$out" && mv "$out.tmp" "$out"
    echo ">>> built $name in $((SECONDS - started))s"
  fi
  for binary in "$out"/*; do
    ln -sfn "$binary" "$bin_links/$(basename "$binary")"
  done
}

build kube "$(kube_ldflags)" \
  kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver \
  kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager \
  kubectl=k8s.io/kubernetes/cmd/kubectl
build etcd "-s -w" etcd=go.etcd.io/etcd/server/v3
helm_version=$(awk '$1 == "helm.sh/helm/v4" {print $2; exit}' "$top/tools/helm/go.mod")
build helm "-s -w -X helm.sh/helm/v4/internal/version.version=$helm_version" helm=helm.sh/helm/v4/cmd/helm
echo ">>> control-plane binaries ready in .cache/bin: $(ls "$bin_links" | tr '\n' ' ')"
