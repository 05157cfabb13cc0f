#!/usr/bin/env bash
# Turn a fresh Debian or Ubuntu instance into a vultrscale worker base image.
#
#   .venv/bin/python -m pip wheel --no-deps -w dist .    # in your clone: a wheel of vultrscale
#   scp -r cloud-init root@HOST:/root/vultrscale-cloud-init
#   scp dist/vultrscale-*.whl root@HOST:/root/vultrscale-cloud-init/
#   ssh root@HOST 'cd /root/vultrscale-cloud-init && VULTRSCALE_SPEC=$(ls ./vultrscale-*.whl) \
#       APP_SPEC="myjobs==1.2" bash bake.sh'
#   vultrscale snapshot --from-instance <instance id>
#
# A worker of another queue (Procrastinate, PgQueuer, graphile-worker, pg-boss: docs/queues.md, "A
# foreign worker"): its unit file is installed instead of vultrscale's worker.service:
#   WORKER_SERVICE=procrastinate-worker WORKER_UNIT=./procrastinate-worker.service \
#       APP_SPEC="myapp==1.2 procrastinate" bash bake.sh
#
# Safe to run again: every step checks before it changes anything.
# Settings (environment):
#   WORKER_USER      login user for the scaler and the unit (default: worker; = fleet.ssh_user)
#   WORKER_SERVICE   unit name (default: worker; = fleet.service)
#   WORKER_UNIT      your own worker's unit file, installed as $WORKER_SERVICE.service instead
#                    of vultrscale's worker.service (default: none); it should read
#                    EnvironmentFile=/etc/vultrscale/worker.env (DATABASE_URL) and run as
#                    WORKER_USER. Install a Node runtime and app yourself: bake.sh sets up
#                    Python only
#   VULTRSCALE_SPEC  what pip installs for vultrscale (required without WORKER_UNIT): a wheel
#                    built from your clone, a git+https URL, or a name your own package index
#                    serves (no default: a bare "vultrscale" could install someone else's
#                    package of that name)
#   APP_SPEC         what pip installs for your job handlers (default: nothing)
#   APP_DIR          a directory copied to /opt/vultrscale/app, the unit's working directory
#                    (on the import path: put a module with your handler there)
#   VENV             virtualenv (default: /opt/vultrscale/venv)
set -euo pipefail

WORKER_USER="${WORKER_USER:-worker}"
WORKER_SERVICE="${WORKER_SERVICE:-worker}"
WORKER_UNIT="${WORKER_UNIT:-}"
VULTRSCALE_SPEC="${VULTRSCALE_SPEC:-}"
APP_SPEC="${APP_SPEC:-}"
APP_DIR="${APP_DIR:-}"
VENV="${VENV:-/opt/vultrscale/venv}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

log() { printf 'bake: %s\n' "$*"; }
die() { printf 'bake: error: %s\n' "$*" >&2; exit 1; }

# Every setting is checked before anything is changed (and before the root check, so a dry
# check of the settings changes nothing anywhere).
if [[ -n "$WORKER_UNIT" ]]; then
    [[ -f "$WORKER_UNIT" && -r "$WORKER_UNIT" ]] || die "WORKER_UNIT '$WORKER_UNIT' is not a readable file"
    unit_text="$(<"$WORKER_UNIT")"
    [[ "$unit_text" == *"[Service]"* && "$unit_text" == *"ExecStart="* ]] || die "WORKER_UNIT '$WORKER_UNIT' is not a service unit (no [Service] with an ExecStart=)"
else
    [[ -n "$VULTRSCALE_SPEC" ]] || die "set VULTRSCALE_SPEC to what pip should install for vultrscale: a wheel of your clone (python3 -m pip wheel --no-deps -w dist .) or a git+https URL (or WORKER_UNIT to your own worker's unit file)"
fi
[[ "$WORKER_USER" =~ ^[a-z_][a-z0-9_-]{0,31}$ ]] || die "WORKER_USER '$WORKER_USER' is not a user name"
[[ "$WORKER_SERVICE" =~ ^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$ ]] || die "WORKER_SERVICE '$WORKER_SERVICE' is not a unit name"
[[ "$WORKER_SERVICE" != *.service ]] || die "WORKER_SERVICE '$WORKER_SERVICE': name the unit without '.service' (${WORKER_SERVICE%.service}), as fleet.service does"
[[ "$VENV" =~ ^/[A-Za-z0-9._/-]+$ ]] || die "VENV '$VENV' is not an absolute path of letters, digits and ._/-"
if [[ -n "$APP_DIR" ]]; then
    [[ -d "$APP_DIR" ]] || die "APP_DIR '$APP_DIR' is not a directory"
    # The worker runs in a copy of it and reads a vultrscale.toml or .env there: the scaler's
    # settings and secrets would be in every snapshot, and would override the user-data's.
    for f in .env vultrscale.toml; do
        [[ ! -e "$APP_DIR/$f" ]] || die "APP_DIR '$APP_DIR' holds $f: copy only your handler code (the scaler's settings and secrets would be in every instance)"
    done
fi
[[ -f "$HERE/worker.service" ]] || die "worker.service not found next to bake.sh"
[[ -f "$HERE/sudoers-worker.tmpl" ]] || die "sudoers-worker.tmpl not found next to bake.sh"
[[ "$(id -u)" -eq 0 ]] || die "run as root"

log "packages"
export DEBIAN_FRONTEND=noninteractive
missing=()
for pkg in python3 python3-venv sudo openssh-server cloud-init; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
    apt-get update -q
    apt-get install -y -q "${missing[@]}"
fi

log "user $WORKER_USER"
if ! id -u "$WORKER_USER" >/dev/null 2>&1; then
    useradd --create-home --shell /bin/bash "$WORKER_USER"
fi
usermod -p '*' "$WORKER_USER"  # no password, but not locked: sshd key login must work
install -d -m 0700 -o "$WORKER_USER" -g "$WORKER_USER" "$(getent passwd "$WORKER_USER" | cut -d: -f6)/.ssh"

if [[ -n "$VULTRSCALE_SPEC" || -n "$APP_SPEC" ]]; then
    log "virtualenv $VENV"
    [[ -x "$VENV/bin/python" ]] || python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
    # shellcheck disable=SC2086  # APP_SPEC may name several requirements
    "$VENV/bin/pip" install -q --upgrade ${VULTRSCALE_SPEC:+"$VULTRSCALE_SPEC"} $APP_SPEC
fi
if [[ -n "$VULTRSCALE_SPEC" ]]; then
    # A wheel rebuilt at the same version is "already installed" to pip: the old code would stay.
    "$VENV/bin/pip" install -q --force-reinstall --no-deps "$VULTRSCALE_SPEC"
fi

install -d -m 0755 /opt/vultrscale/app
if [[ -n "$APP_DIR" ]]; then
    cp -a "$APP_DIR/." /opt/vultrscale/app/
    chown -R root:root /opt/vultrscale/app
fi

log "unit $WORKER_SERVICE.service (runs as $WORKER_USER)"
install -d -m 0755 /etc/vultrscale
if [[ -n "$WORKER_UNIT" ]]; then
    # Your worker's own unit, as written; cloud-init's drop-in sets its TimeoutStopSec.
    install -m 0644 "$WORKER_UNIT" "/etc/systemd/system/$WORKER_SERVICE.service"
    [[ "$unit_text" == *"EnvironmentFile=/etc/vultrscale/worker.env"* ]] || log "note: $WORKER_UNIT does not read EnvironmentFile=/etc/vultrscale/worker.env, where each instance's DATABASE_URL is written"
else
    sed -e "s/^User=.*/User=$WORKER_USER/" -e "s/^Group=.*/Group=$WORKER_USER/" \
        -e "s|^ExecStart=/opt/vultrscale/venv/|ExecStart=$VENV/|" \
        "$HERE/worker.service" >"/etc/systemd/system/$WORKER_SERVICE.service"
fi
chmod 0644 "/etc/systemd/system/$WORKER_SERVICE.service"
systemctl daemon-reload
# Enabled at boot by cloud-init once /etc/vultrscale/worker.env exists, not here.
systemctl disable "$WORKER_SERVICE.service" >/dev/null 2>&1 || true

log "sudoers"
tmp="$(mktemp)"
trap 'rm -f "$tmp"' EXIT
sed -e "s|\${user}|$WORKER_USER|g" -e "s|\${service}|$WORKER_SERVICE|g" \
    -e "s|\${systemctl}|/usr/bin/systemctl|g" "$HERE/sudoers-worker.tmpl" >"$tmp"
visudo -cqf "$tmp" || die "the rendered sudoers rule is invalid"
install -m 0440 -o root -g root "$tmp" /etc/sudoers.d/vultrscale-worker

log "cloud-init: forget this boot so instances made from the snapshot run their user-data"
cloud-init clean --logs
rm -f /etc/vultrscale/worker.env

log "done: power off and take a snapshot (vultrscale snapshot --from-instance <id>)"
