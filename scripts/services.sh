#!/usr/bin/env bash
# Start, stop and inspect the RabbitMQ and ZooKeeper that hashq's demo and tests use.
#
#   scripts/services.sh up [rabbitmq|zookeeper]       start (both by default) and wait until they answer
#   scripts/services.sh down [rabbitmq|zookeeper]     stop only what this script started
#   scripts/services.sh restart [rabbitmq|zookeeper]  down, then up
#   scripts/services.sh status                        say what runs and whether it answers
#   scripts/services.sh env                           print the HASHQ_ settings that reach them
#
# Where a Docker engine answers, docker-compose.yml is used. Otherwise the Debian packages
# rabbitmq-server and zookeeper run as plain processes, installed with apt-get when missing
# and the user is root. All their state lives under $HASHQ_SERVICES_DIR (default
# .services/ in the checkout); everything listens on 127.0.0.1 only.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STATE=${HASHQ_SERVICES_DIR:-$ROOT/.services}
AMQP_PORT=${HASHQ_SERVICES_AMQP_PORT:-5672}
MGMT_PORT=${HASHQ_SERVICES_MANAGEMENT_PORT:-15672}
ZK_PORT=${HASHQ_SERVICES_ZK_PORT:-2181}
DIST_PORT=$((AMQP_PORT + 20000))
# A private epmd port, so that stopping ours never disturbs another Erlang node on the machine.
EPMD_PORT=${HASHQ_SERVICES_EPMD_PORT:-4371}
RABBIT_BIN=/usr/lib/rabbitmq/bin
ZK_JARS=/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar

say() { printf 'services: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

use_docker() {
    [ "${HASHQ_SERVICES_MODE:-auto}" != local ] && command -v docker >/dev/null 2>&1 \
        && timeout 5 docker info >/dev/null 2>&1
}

# ---------------------------------------------------------------- packages
ensure_packages() {
    local missing=()
    [ -x "$RABBIT_BIN/rabbitmq-server" ] || missing+=(rabbitmq-server)
    [ -f /usr/share/java/zookeeper.jar ] || missing+=(zookeeper)
    [ ${#missing[@]} -eq 0 ] && return 0
    [ "$(id -u)" -eq 0 ] || die "missing Debian packages: ${missing[*]} (install them, or run as root so this script can)"
    say "installing ${missing[*]} with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq "${missing[@]}" >/dev/null
}

# ---------------------------------------------------------------- rabbitmq
rabbit_env() {
    local dir=$STATE/rabbitmq
    export HOME=$dir RABBITMQ_HOME=/usr/lib/rabbitmq
    export RABBITMQ_NODENAME=rabbit@localhost RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
    export RABBITMQ_NODE_PORT=$AMQP_PORT RABBITMQ_DIST_PORT=$DIST_PORT
    export RABBITMQ_MNESIA_BASE=$dir/mnesia RABBITMQ_LOG_BASE=$dir/log
    export RABBITMQ_ENABLED_PLUGINS_FILE=$dir/enabled_plugins
    export RABBITMQ_CONFIG_FILE=$dir/rabbitmq.conf RABBITMQ_CONF_ENV_FILE=$dir/rabbitmq-env.conf
    export RABBITMQ_PID_FILE=$dir/rabbit.pid
    export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
    export ERL_EPMD_ADDRESS=127.0.0.1 ERL_EPMD_PORT=$EPMD_PORT
}

rabbit_alive() {
    local pidfile=$STATE/rabbitmq/rabbit.pid
    [ -s "$pidfile" ] && pid_running "$(cat "$pidfile")"
}

rabbit_answers() {
    curl -fsS -m 3 -u guest:guest "http://127.0.0.1:$MGMT_PORT/api/overview" >/dev/null 2>&1
}

rabbit_up() {
    local dir=$STATE/rabbitmq
    if rabbit_alive; then say "rabbitmq already running (pid $(cat "$dir/rabbit.pid"))"; return 0; fi
    wait_port_free "$AMQP_PORT" || die "port $AMQP_PORT is taken by another process; set HASHQ_SERVICES_AMQP_PORT"
    mkdir -p "$dir/mnesia" "$dir/log"
    : >"$dir/rabbitmq-env.conf"
    cat >"$dir/rabbitmq.conf" <<EOF
listeners.tcp.default = 127.0.0.1:$AMQP_PORT
management.tcp.ip = 127.0.0.1
management.tcp.port = $MGMT_PORT
loopback_users = none
disk_free_limit.absolute = 256MB
collect_statistics_interval = 1000
EOF
    rabbit_env
    "$RABBIT_BIN/rabbitmq-plugins" enable --offline rabbitmq_consistent_hash_exchange rabbitmq_management >/dev/null
    say "starting rabbitmq on 127.0.0.1:$AMQP_PORT (management $MGMT_PORT)"
    setsid "$RABBIT_BIN/rabbitmq-server" -detached >"$dir/log/start.out" 2>&1
    "$RABBIT_BIN/rabbitmqctl" wait --timeout 120 "$RABBITMQ_PID_FILE" >/dev/null \
        || die "rabbitmq did not start; see $dir/log"
    "$RABBIT_BIN/rabbitmqctl" await_startup --timeout 120 >/dev/null
    wait_for "rabbitmq management API" 60 rabbit_answers
}

rabbit_down() {
    local dir=$STATE/rabbitmq
    [ -s "$dir/rabbit.pid" ] || { say "rabbitmq: not started by this script"; return 0; }
    rabbit_env
    if rabbit_alive; then
        say "stopping rabbitmq"
        "$RABBIT_BIN/rabbitmqctl" shutdown --timeout 60 >/dev/null 2>&1 || kill "$(cat "$dir/rabbit.pid")" 2>/dev/null || true
    fi
    # epmd outlives the node; ours listens on a private port, so this stops only ours.
    epmd -port "$EPMD_PORT" -kill >/dev/null 2>&1 || true
    rm -f "$dir/rabbit.pid"
}

# ---------------------------------------------------------------- zookeeper
zk_alive() {
    local pidfile=$STATE/zookeeper/zk.pid
    [ -s "$pidfile" ] && pid_running "$(cat "$pidfile")"
}

zk_answers() {
    local reply
    reply=$(timeout 3 bash -c "exec 3<>/dev/tcp/127.0.0.1/$ZK_PORT; printf srvr >&3; cat <&3" 2>/dev/null) || return 1
    [[ $reply == *"Mode: standalone"* ]]
}

zk_up() {
    local dir=$STATE/zookeeper
    if zk_alive; then say "zookeeper already running (pid $(cat "$dir/zk.pid"))"; return 0; fi
    wait_port_free "$ZK_PORT" || die "port $ZK_PORT is taken by another process; set HASHQ_SERVICES_ZK_PORT"
    mkdir -p "$dir/data"
    # A short tick lets tests use short sessions (the minimum session is 2 ticks).
    cat >"$dir/zoo.cfg" <<EOF
tickTime=500
minSessionTimeout=1000
maxSessionTimeout=60000
dataDir=$dir/data
clientPort=$ZK_PORT
clientPortAddress=127.0.0.1
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr,stat,mntr
EOF
    say "starting zookeeper on 127.0.0.1:$ZK_PORT"
    # setsid: the server must not belong to the caller's process group, which a test harness
    # may kill as a whole.
    setsid nohup java -Xmx256m -cp "$ZK_JARS" org.apache.zookeeper.server.ZooKeeperServerMain \
        "$dir/zoo.cfg" >"$dir/zookeeper.log" 2>&1 </dev/null &
    echo $! >"$dir/zk.pid"
    wait_for zookeeper 60 zk_answers
}

zk_down() {
    local dir=$STATE/zookeeper pid
    [ -s "$dir/zk.pid" ] || { say "zookeeper: not started by this script"; return 0; }
    pid=$(cat "$dir/zk.pid")
    if zk_alive; then
        say "stopping zookeeper"
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 100); do zk_alive || break; sleep 0.1; done
        if zk_alive; then
            kill -9 "$pid" 2>/dev/null || true
            for _ in $(seq 50); do zk_alive || break; sleep 0.1; done
        fi
    fi
    rm -f "$dir/zk.pid"
}

# ---------------------------------------------------------------- helpers
# Exited daemons can linger as zombies (nothing reaps them here): alive means not state Z.
pid_running() { kill -0 "$1" 2>/dev/null && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }
port_free() { ! ss -Hltn "sport = :$1" 2>/dev/null | grep -q .; }

# A process we just stopped may hold its port for a moment longer on a busy machine.
wait_port_free() {
    for _ in $(seq 100); do port_free "$1" && return 0; sleep 0.1; done
    return 1
}

wait_for() {
    local what=$1 seconds=$2 probe=$3
    for _ in $(seq $((seconds * 4))); do
        "$probe" && { say "$what answers"; return 0; }
        sleep 0.25
    done
    die "$what did not answer within ${seconds}s (logs under $STATE)"
}

targets() { if [ -n "${1:-}" ]; then echo "$1"; else echo "rabbitmq zookeeper"; fi; }

status() {
    if use_docker; then docker compose -f "$ROOT/docker-compose.yml" ps; return; fi
    local r z
    r=$(rabbit_alive && echo "running (pid $(cat "$STATE/rabbitmq/rabbit.pid"))" || echo stopped)
    z=$(zk_alive && echo "running (pid $(cat "$STATE/zookeeper/zk.pid"))" || echo stopped)
    rabbit_answers && r="$r, answers on 127.0.0.1:$AMQP_PORT" || r="$r, not answering"
    zk_answers && z="$z, answers on 127.0.0.1:$ZK_PORT" || z="$z, not answering"
    echo "rabbitmq:  $r"
    echo "zookeeper: $z"
    rabbit_answers && zk_answers
}

print_env() {
    echo "export HASHQ_AMQP_URL=amqp://guest:guest@127.0.0.1:$AMQP_PORT/"
    echo "export HASHQ_MANAGEMENT_URL=http://127.0.0.1:$MGMT_PORT"
    echo "export HASHQ_ZK_HOSTS=127.0.0.1:$ZK_PORT"
}

main() {
    local cmd=${1:-status} target=${2:-}
    case "$target" in ""|rabbitmq|zookeeper) ;; *) die "unknown service '$target' (rabbitmq or zookeeper)";; esac
    case "$cmd" in
        up|down|restart)
            if use_docker; then
                local services; services=$(targets "$target")
                case "$cmd" in
                    up) docker compose -f "$ROOT/docker-compose.yml" up -d --wait $services ;;
                    down) if [ -n "$target" ]; then docker compose -f "$ROOT/docker-compose.yml" stop $services
                          else docker compose -f "$ROOT/docker-compose.yml" down; fi ;;
                    restart) docker compose -f "$ROOT/docker-compose.yml" restart $services
                             docker compose -f "$ROOT/docker-compose.yml" up -d --wait $services ;;
                esac
                return
            fi
            [ "$cmd" = down ] || ensure_packages
            for t in $(targets "$target"); do
                case "$cmd" in
                    up) "${t}_up" ;;
                    down) "${t}_down" ;;
                    restart) "${t}_down"; "${t}_up" ;;
                esac
            done ;;
        status) status ;;
        env) print_env ;;
        *) die "usage: $0 up|down|restart|status|env [rabbitmq|zookeeper]" ;;
    esac
}

# Function names per service, so that main can dispatch on the name.
rabbitmq_up() { rabbit_up; }
rabbitmq_down() { rabbit_down; }
zookeeper_up() { zk_up; }
zookeeper_down() { zk_down; }

main "$@"
