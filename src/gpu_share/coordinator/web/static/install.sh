#!/usr/bin/env bash
# GPU Share: install the provider agent on this machine (SPEC §3.2).
#
# A coordinator serves this script at /agent/install.sh with its own URL filled in:
#
#   curl -fsSL https://COORDINATOR/agent/install.sh | sudo bash -s -- --token gpu_et_…
#
# It installs the agent into a virtual environment under a prefix (from the wheel the
# coordinator serves; pip fetches the dependencies from your index), writes the settings
# to a root-only file, and runs the agent as the systemd service gpu-share-agent, or, with
# --docker, as a container of the agent image. Running it again updates in place.
# `--help` lists the options.
set -euo pipefail

# Filled in by the coordinator serving this script; left as they are, --server is needed.
# The server is its configured public URL (GPUSHARE_PUBLIC_BASE_URL), never a guess from
# the request: without one it is empty here, and --server is needed.
SERVER_DEFAULT=@GPU_SHARE_SERVER@
WHEEL_NAME=@GPU_SHARE_WHEEL@

PROG=install.sh
UNIT_NAME=gpu-share-agent.service
UNIT_PATH=/etc/systemd/system/$UNIT_NAME
CONTAINER_NAME=gpu-share-agent
AGENT_UID=10001                 # the agent image's user (deploy/agent.Dockerfile)
JOB_LABEL=dev.gpu-share.job     # marks the Docker sandbox's job containers
DOCKER_SOCKET=/var/run/docker.sock
MARKER=.gpu-share-agent         # in the prefix: this script made it, --uninstall may empty it
URL_PATTERN='^https?://[][A-Za-z0-9.:/_~%@-]+$'  # host ([v6] too), port, path: nothing to quote

usage() {
  cat <<EOF
Install the GPU Share agent on this machine.

Usage: $PROG --token gpu_et_… [options]
       $PROG --uninstall [--prefix DIR]

  --token TOKEN     the provider's enrollment token (gpu_et_…); a second run keeps the
                    one from the first when left out
  --server URL      the coordinator (default: ${SERVER_DEFAULT:-none: the coordinator that
                    serves this script fills in its GPUSHARE_PUBLIC_BASE_URL, and this one
                    has none set})
  --prefix DIR      where everything goes: venv/, data/ (node identity, download cache,
                    job folders), agent.env (settings, owner-only), bin/gpu-share-agent
                    (default /opt/gpu-share)
  --python PATH     the Python 3.11+ that builds the virtual environment (default: the
                    newest python3.X on PATH)
  --package SPEC    what pip installs instead of the coordinator's wheel, e.g.
                    'gpu-share[agent,onnx,catboost]==0.4.0' from your own index
  --pip-args ARGS   more arguments for pip, e.g. '--index-url https://mirror/simple' or
                    '--no-index --find-links /wheels' on a machine without PyPI
  --no-service      install and configure, but start nothing: prints the command that
                    starts the agent (bin/gpu-share-agent), for your own supervisor
  --docker          run the agent image under Docker (needs the NVIDIA runtime) instead
                    of a virtual environment and a systemd service; jobs then run in
                    sibling containers of the same image
  --image NAME      the agent image for --docker (default gpu-share-agent:latest)
  --uninstall       stop and remove the service or container, then the virtual
                    environment, the settings and the data folder (node identity,
                    cache, job folders): nothing of the tenants' jobs stays behind
  -h, --help        this text

Root is needed for a prefix you cannot write to (such as the default), for the systemd
service and for --docker. The agent's other settings (GPUSHARE_AGENT_*, see README) may
be added to agent.env as KEY=value lines; a second run keeps them.
EOF
}

say() { printf '%s\n' "$*"; }
warn() { printf '%s: warning: %s\n' "$PROG" "$*" >&2; }
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }

problem() { problems+=("$*"); }
fail_on_problems() {
  ((${#problems[@]})) || return 0
  local line
  for line in "${problems[@]}"; do printf '%s: error: %s\n' "$PROG" "$line" >&2; done
  exit 1
}

# --- arguments ---------------------------------------------------------------------

server=""
token=""
prefix=/opt/gpu-share
python=""
package=""
pip_args=""
no_service=0
docker=0
image=gpu-share-agent:latest
uninstall=0
problems=()

need_value() { [[ $# -ge 2 && -n $2 ]] || die "$1 needs a value (see --help)"; }

parse_args() {
  if [[ $SERVER_DEFAULT != @* ]]; then
    server=$SERVER_DEFAULT
  else
    SERVER_DEFAULT=""
  fi
  [[ $WHEEL_NAME != @* ]] || WHEEL_NAME=""
  while (($#)); do
    case $1 in
      --token) need_value "$@"; token=$2; shift 2 ;;
      --server) need_value "$@"; server=${2%/}; shift 2 ;;
      --prefix) need_value "$@"; prefix=${2%/}; shift 2 ;;
      --python) need_value "$@"; python=$2; shift 2 ;;
      --package) need_value "$@"; package=$2; shift 2 ;;
      --pip-args) need_value "$@"; pip_args=$2; shift 2 ;;
      --image) need_value "$@"; image=$2; shift 2 ;;
      --token=* | --server=* | --prefix=* | --python=* | --package=* | --pip-args=* | --image=*)
        set -- "${1%%=*}" "${1#*=}" "${@:2}" ;;
      --no-service) no_service=1; shift ;;
      --docker) docker=1; shift ;;
      --uninstall) uninstall=1; shift ;;
      -h | --help) usage; exit 0 ;;
      *) die "unknown option $1 (see --help)" ;;
    esac
  done

  # Values go into agent.env (read by the launcher, systemd and `docker --env-file`) as
  # plain KEY=value lines: only characters that mean nothing to any of them.
  [[ $prefix =~ ^/[A-Za-z0-9._/+-]*$ && $prefix != / ]] \
    || die "--prefix must be an absolute path of letters, digits and ._+-/ (got '$prefix')"
  venv=$prefix/venv
  data_dir=$prefix/data
  env_file=$prefix/agent.env
  launcher=$prefix/bin/gpu-share-agent
  pid_file=$prefix/agent.pid
}

is_root() { [[ $(id -u) -eq 0 ]]; }
systemd_running() { [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null; }
docker_works() { command -v docker >/dev/null && docker info >/dev/null 2>&1; }

# Whether this user may create or change $1 (the nearest existing folder decides).
may_write() {
  local dir=$1
  while [[ ! -e $dir ]]; do dir=$(dirname "$dir"); done
  [[ -w $dir ]]
}

# --- uninstall ---------------------------------------------------------------------

running() {  # PID: alive, and not a zombie waiting for its parent to collect it
  local state
  state=$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ ${state:0:1} != Z ]]
}

stop_launched_agent() {
  # An agent started by bin/gpu-share-agent (not by systemd) left its pid behind.
  [[ -f $pid_file ]] || return 0
  local pid
  pid=$(<"$pid_file")
  [[ $pid =~ ^[0-9]+$ ]] || return 0
  if [[ -r /proc/$pid/cmdline ]] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF "$venv/"; then
    say "stopping the agent (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 120); do running "$pid" || return 0; sleep 0.5; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
}

unit_is_ours() { [[ -f $UNIT_PATH ]] && grep -qF "$launcher" "$UNIT_PATH"; }

remove_unit() {
  unit_is_ours || return 0
  if systemd_running; then systemctl disable --now "$UNIT_NAME" >/dev/null 2>&1 || true; fi
  rm -f "$UNIT_PATH"
  if systemd_running; then systemctl daemon-reload; fi
  say "removed the systemd service $UNIT_NAME"
}

do_uninstall() {
  if [[ -e $prefix && ! -e $prefix/$MARKER ]]; then
    die "$prefix was not made by this script (no $MARKER in it): remove it by hand"
  fi
  if ! is_root; then
    ! unit_is_ours || problem "removing the systemd service needs root: run with sudo"
    [[ ! -e $prefix ]] || may_write "$prefix" || problem "removing $prefix needs root: run with sudo"
  fi
  fail_on_problems

  remove_unit
  if docker_works; then
    if [[ -n $(docker ps -aq --filter "name=^${CONTAINER_NAME}\$") ]]; then
      docker rm -f "$CONTAINER_NAME" >/dev/null
      say "removed the container $CONTAINER_NAME"
    fi
    local jobs
    jobs=$(docker ps -aq --filter "label=$JOB_LABEL")
    if [[ -n $jobs ]]; then
      # shellcheck disable=SC2086 # one id per word
      docker rm -f $jobs >/dev/null
      say "removed the job containers"
    fi
  fi
  stop_launched_agent
  if [[ -e $prefix ]]; then
    # A job may have left folders it made unreadable; they are its owner's to remove.
    chmod -R u+rwX "$data_dir" 2>/dev/null || true
    rm -rf "$venv" "$data_dir" "${prefix:?}/bin" "$env_file" "$pid_file"
    rm -f "$prefix/$MARKER"
    rmdir "$prefix" 2>/dev/null || warn "kept $prefix: it holds files this script did not make"
  fi
  say "removed the GPU Share agent from $prefix"
}

# --- checks: every problem on its own line, then stop ----------------------------------

fetch_to() {  # URL FILE
  if command -v curl >/dev/null; then
    curl -fsSL --retry 2 --connect-timeout 10 -o "$2" "$1"
  else
    wget -q --tries=3 --timeout=10 -O "$2" "$1"
  fi
}

find_python() {
  local candidate
  if [[ -n $python ]]; then
    set -- "$python"
  else
    set -- python3.14 python3.13 python3.12 python3.11 python3
  fi
  for candidate in "$@"; do
    if "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1; then
      printf '%s\n' "$candidate"
      return 0
    fi
  done
  return 1
}

existing_setting() {  # KEY: its value in an existing agent.env
  [[ -r $env_file ]] || return 0
  sed -n "s/^$1=//p" "$env_file" | tail -n 1
}

check_install() {
  if [[ -z $token ]]; then
    token=$(existing_setting GPUSHARE_AGENT_TOKEN)
  fi

  if [[ -z $server ]]; then
    problem "no coordinator URL: pass --server https://COORDINATOR (the address you fetched" \
      "this script from); the coordinator fills it in once its operator sets" \
      "GPUSHARE_PUBLIC_BASE_URL"
  elif [[ ! $server =~ $URL_PATTERN ]]; then
    problem "--server must be an http(s) URL without spaces or quotes (got '$server')"
  fi
  if [[ -z $token && ! -s $data_dir/identity.json ]]; then
    problem "no enrollment token: pass --token gpu_et_… (the provider's page shows it)"
  elif [[ -n $token && ! $token =~ ^gpu_et_[A-Za-z0-9_-]+$ ]]; then
    problem "--token must look like gpu_et_… (got '${token:0:12}…')"
  fi
  if ((docker && no_service)); then
    problem "--docker and --no-service do not go together: --docker starts a container"
  fi
  if [[ -n $package && $docker -eq 1 ]]; then
    problem "--package is for the virtual environment; --docker runs the image as built"
  fi

  if ! is_root; then
    may_write "$prefix" \
      || problem "installing into $prefix needs root: run with sudo, or pass --prefix DIR you own"
    if ((docker)); then
      problem "--docker needs root (it gives the agent the Docker socket): run with sudo"
    elif ((!no_service)) && systemd_running; then
      problem "installing the systemd service needs root: run with sudo, or pass --no-service"
    fi
  fi

  if ((docker)); then
    if ! command -v docker >/dev/null; then
      problem "--docker needs Docker Engine, and there is no docker command here"
    elif ! docker info >/dev/null 2>&1; then
      problem "--docker needs a running Docker engine, and \`docker info\` failed"
    elif ! docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"nvidia"'; then
      problem "--docker needs Docker's NVIDIA runtime: install the NVIDIA Container Toolkit and run \`nvidia-ctk runtime configure --runtime=docker\`, then restart Docker"
    elif [[ ! -S $DOCKER_SOCKET ]]; then
      problem "--docker needs the engine's socket at $DOCKER_SOCKET for the agent's job containers"
    fi
  else
    if ! "$venv/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      if ! python=$(find_python); then
        problem "no Python 3.11 or newer found: install one (e.g. apt-get install python3.11 python3.11-venv) or pass --python PATH"
      elif ! "$python" -c 'import ensurepip, venv' >/dev/null 2>&1; then
        problem "$python cannot make virtual environments: install its venv module (Debian/Ubuntu: apt-get install python3-venv)"
      fi
    fi
  fi

  if ! command -v curl >/dev/null && ! command -v wget >/dev/null; then
    problem "neither curl nor wget is installed: install one"
  elif [[ -n $server ]] && ! fetch_to "$server/health" /dev/null 2>/dev/null; then
    problem "cannot reach the coordinator at $server (GET /health failed): check the URL, DNS, firewall and proxy"
  fi
  if [[ -z $package && -z $WHEEL_NAME && $docker -eq 0 ]]; then
    problem "this copy of the script names no wheel: download it from the coordinator's /agent/install.sh, or pass --package SPEC"
  fi
  fail_on_problems
}

# --- install -----------------------------------------------------------------------

prepare_prefix() {
  mkdir -p "$prefix/bin"
  (umask 077 && mkdir -p "$data_dir")
  chmod 700 "$data_dir"  # job folders live in it; bwrap refuses them in an open folder
  say "Made by the GPU Share agent installer; '$PROG --uninstall --prefix $prefix' removes it." \
    >"$prefix/$MARKER"
}

write_settings() {
  # Our keys first, then whatever else an earlier agent.env held (the owner's additions).
  local new=$work/agent.env
  (
    umask 077
    {
      say "# GPU Share agent settings, written by install.sh (a second run keeps other lines)."
      say "GPUSHARE_AGENT_SERVER=$server"
      [[ -z $token ]] || say "GPUSHARE_AGENT_TOKEN=$token"
      say "GPUSHARE_AGENT_DATA_DIR=$data_dir"
      if [[ -r $env_file ]]; then
        grep -v -e '^# GPU Share agent settings' -e '^GPUSHARE_AGENT_SERVER=' \
          -e '^GPUSHARE_AGENT_TOKEN=' -e '^GPUSHARE_AGENT_DATA_DIR=' "$env_file" || true
      fi
    } >"$new"
  )
  chmod 600 "$new"
  mv -f "$new" "$env_file"
}

write_launcher() {
  cat >"$launcher" <<EOF
#!/usr/bin/env bash
# Starts the GPU Share agent with the settings in $env_file. Written by install.sh;
# the systemd service $UNIT_NAME runs it too. Arguments go to \`gpu-share agent\`.
set -euo pipefail
while IFS= read -r line || [[ -n \$line ]]; do
  case \$line in '' | '#'*) continue ;; esac
  export "\${line%%=*}=\${line#*=}"
done <'$env_file'
echo "\$\$" >'$pid_file'
exec '$venv/bin/gpu-share' agent "\$@"
EOF
  chmod 755 "$launcher"
}

has_nvidia_gpu() { command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; }

pip_install() {  # ARGS…: pip in the venv, its output kept for when every try fails
  local -a extra=()
  read -r -a extra <<<"$pip_args"  # words, as a shell would split them (no globbing)
  "$venv/bin/python" -m pip install --disable-pip-version-check --no-input -q \
    "${extra[@]}" "$@" >>"$work/pip.log" 2>&1
}

install_venv() {
  if ! "$venv/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    rm -rf "$venv"
    say "creating the virtual environment $venv ($("$python" --version 2>&1))"
    "$python" -m venv "$venv"
  fi
  if [[ -n $package ]]; then
    say "installing $package"
    pip_install --upgrade "$package" || { tail -n 25 "$work/pip.log" >&2; die "pip could not install $package (its output is above)"; }
    return
  fi

  local wheel=$work/$WHEEL_NAME
  say "downloading the agent from $server/agent/$WHEEL_NAME"
  fetch_to "$server/agent/$WHEEL_NAME" "$wheel" || die "cannot download $server/agent/$WHEEL_NAME"

  # The richest set of runtimes pip can install here: CUDA onnxruntime where a GPU is,
  # then CPU onnxruntime, CatBoost where it has a build for this machine.
  local -a tries=()
  if has_nvidia_gpu; then
    tries+=("agent,catboost onnxruntime-gpu>=1.18")
    # onnxruntime and onnxruntime-gpu share one folder: removing the CPU one later would
    # break the GPU one, so it goes first.
    "$venv/bin/python" -m pip uninstall -y -q onnxruntime >/dev/null 2>&1 || true
  fi
  tries+=("agent,onnx,catboost" "agent,onnx" "agent")
  local attempt extras installed=""
  for attempt in "${tries[@]}"; do
    extras=${attempt%% *}
    local -a more=()
    [[ $attempt != *' '* ]] || more=("${attempt#* }")
    if pip_install "${wheel}[$extras]" "${more[@]}"; then
      installed=$attempt
      break
    fi
    warn "could not install the agent with [$attempt]; trying with fewer runtimes"
  done
  [[ -n $installed ]] || { tail -n 25 "$work/pip.log" >&2; die "pip could not install the agent (its output is above)"; }
  # The same version may hold new code (an updated coordinator): always replace the package.
  pip_install --force-reinstall --no-deps "$wheel" \
    || { tail -n 25 "$work/pip.log" >&2; die "pip could not install $WHEEL_NAME"; }
  say "installed gpu-share with [$installed]"
}

write_unit() {
  cat >"$work/unit" <<EOF
[Unit]
Description=GPU Share agent (runs tenants' jobs on this machine's GPUs)
Wants=network-online.target
After=network-online.target

[Service]
Type=simple
ExecStart=$launcher
Restart=always
RestartSec=5
# The agent lets running jobs finish (GPUSHARE_AGENT_DRAIN_TIMEOUT_SEC, 30 s) on SIGTERM.
KillMode=mixed
TimeoutStopSec=90

[Install]
WantedBy=multi-user.target
EOF
  install -m 644 "$work/unit" "$UNIT_PATH"
  systemctl daemon-reload
  systemctl enable "$UNIT_NAME" >/dev/null 2>&1
  systemctl restart "$UNIT_NAME"
}

run_container() {
  if ! docker image inspect "$image" >/dev/null 2>&1 && ! docker pull -q "$image" >/dev/null; then
    die "the image $image is not on this machine and cannot be pulled: build it in a checkout (docker build -f deploy/agent.Dockerfile -t $image .) or pass --image NAME"
  fi
  chown -R "$AGENT_UID:$AGENT_UID" "$data_dir"
  docker rm -f "$CONTAINER_NAME" >/dev/null 2>&1 || true
  # Jobs run in sibling containers (the Docker sandbox), which bind job folders by their
  # path on this machine: the data folder has the same path inside as outside.
  docker run -d --name "$CONTAINER_NAME" --restart unless-stopped --gpus all \
    --env-file "$env_file" \
    -e GPUSHARE_AGENT_SANDBOX=docker -e "GPUSHARE_AGENT_DOCKER_IMAGE=$image" \
    -v "$data_dir:$data_dir" -v "$DOCKER_SOCKET:$DOCKER_SOCKET" \
    --group-add "$(stat -c %g "$DOCKER_SOCKET")" \
    "$image" >/dev/null
}

# --- the whole run: nothing starts before bash has read all of this file (piped in) --

main() {
  parse_args "$@"
  if ((uninstall)); then
    do_uninstall
    return
  fi
  check_install
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT

  prepare_prefix
  write_settings
  say "settings: $env_file (readable by $(id -un) only)"

  if ((docker)); then
    remove_unit  # one agent per machine: the container replaces an earlier service
    run_container
    say "the agent runs in the container $CONTAINER_NAME (image $image, restarts unless stopped)"
    say "  logs: docker logs -f $CONTAINER_NAME"
    say "  remove: $PROG --uninstall --prefix $prefix"
    return
  fi

  install_venv
  write_launcher
  version=$("$venv/bin/gpu-share" --version 2>&1) || die "the installed agent does not start: $version"
  say "$version installed in $prefix"

  if ((no_service)); then
    say "no service installed (--no-service)."
    say "start the agent with: $launcher"
  elif systemd_running; then
    if docker_works; then docker rm -f "$CONTAINER_NAME" >/dev/null 2>&1 || true; fi
    write_unit
    say "the agent runs as the systemd service $UNIT_NAME (restarts always)"
    say "  logs: journalctl -u $UNIT_NAME -f"
  else
    say "systemd is not running here, so no service was installed."
    say "start the agent with: $launcher"
  fi
}

main "$@"
