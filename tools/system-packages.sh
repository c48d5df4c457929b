#!/usr/bin/env bash
# Debian packages the local stack needs, installed only when missing (make test, make demo and CI call it).
set -euo pipefail
missing=()
command -v java >/dev/null || missing+=(openjdk-17-jdk-headless)
command -v mvn >/dev/null || missing+=(maven)
command -v openssl >/dev/null || missing+=(openssl)
# git: Argo CD clones the GitOps tests' repository; patch: Argo CD's build (tools/argocd).
command -v git >/dev/null || missing+=(git)
command -v patch >/dev/null || missing+=(patch)
compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null || missing+=(postgresql)
# The node: container runtime, CNI plugins, iptables for kube-proxy, and the image builders.
for tool in containerd runc iptables conntrack buildah debootstrap; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
[ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing Debian packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# Packages whose services the stack starts itself, so their own must not start (policy-rc.d):
# Prometheus and promtool (the stack scrapes what the chart's monitors select, and checks its alert
# rules), and Redis (Argo CD's cache, for the GitOps tests).
services=()
command -v promtool >/dev/null || services+=(prometheus)
command -v redis-server >/dev/null || services+=(redis-server)
if [ ${#services[@]} -gt 0 ]; then
  echo "installing Debian packages: ${services[*]}"
  [ ${#missing[@]} -gt 0 ] || apt-get update -qq
  policy=/usr/sbin/policy-rc.d
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy"
    trap 'rm -f "$policy"' EXIT
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${services[@]}" >/dev/null
fi
command -v go >/dev/null || { echo "Go >= 1.25 is required to build the local stack" >&2; exit 1; }
