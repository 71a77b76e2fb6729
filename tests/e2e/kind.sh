#!/usr/bin/env bash
# make e2e-kind: the end-to-end tests on a kind cluster, where Docker exists. Creates the
# cluster (deleted at the end if created here; KEEP_KIND=1 keeps it), loads the images that
# `make images` built and the official Kafka image (pulled here when Docker lacks it, so the
# node never pulls), and runs tests/e2e with E2E_TARGET=kind: the tests install the chart
# themselves, as on the local cluster.
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top"
: "${KIND_VERSION:?}" "${KIND_CLUSTER:?}" "${SPARK_APP_IMAGE:?}" "${OPERATOR_IMAGE:?}" "${KAFKA_IMAGE:?}"

kind=$(command -v kind || true)
if [ -z "$kind" ]; then
  kind="$top/.cache/bin/kind"
  if [ ! -x "$kind" ]; then
    echo ">>> building kind $KIND_VERSION into .cache/bin"
    GOBIN="$top/.cache/bin" go install "sigs.k8s.io/kind@$KIND_VERSION"
  fi
fi

kubeconfig="$top/.cache/kind/kubeconfig"
mkdir -p "$(dirname "$kubeconfig")"
created=no
if ! "$kind" get clusters | grep -qx "$KIND_CLUSTER"; then
  echo ">>> creating the kind cluster $KIND_CLUSTER"
  "$kind" create cluster --name "$KIND_CLUSTER" --kubeconfig "$kubeconfig" --wait 180s
  created=yes
else
  "$kind" get kubeconfig --name "$KIND_CLUSTER" > "$kubeconfig"
fi
if [ "$created" = yes ] && [ "${KEEP_KIND:-0}" != 1 ]; then
  trap '"$kind" delete cluster --name "$KIND_CLUSTER"' EXIT
fi

docker image inspect "$KAFKA_IMAGE" >/dev/null 2>&1 || docker pull "$KAFKA_IMAGE"
echo ">>> loading $SPARK_APP_IMAGE, $OPERATOR_IMAGE and $KAFKA_IMAGE into the kind node"
"$kind" load docker-image "$SPARK_APP_IMAGE" "$OPERATOR_IMAGE" "$KAFKA_IMAGE" --name "$KIND_CLUSTER"

echo ">>> the e2e tests on kind"
# shellcheck disable=SC2086 # E2E_ARGS is a list of pytest arguments
E2E_TARGET=kind E2E_KUBECONFIG="$kubeconfig" .venv/bin/python -m pytest tests/e2e -q ${E2E_ARGS:-}
