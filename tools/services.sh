#!/usr/bin/env bash
# Start, stop and inspect the RabbitMQ and ZooKeeper that hashq's demo and tests use.
#
#   tools/services.sh up [rabbitmq|zookeeper]       start (both by default) and wait until they answer
#   tools/services.sh down [rabbitmq|zookeeper]     stop only what this script started
#   tools/services.sh restart [rabbitmq|zookeeper]  down, then up
#   tools/services.sh status                        say what runs and whether it answers
#   tools/services.sh env                           print the HASHQ_ settings that reach them
#   tools/services.sh kill [rabbitmq|zookeeper]     SIGKILL them, keeping their state for the next up
#
# Where a Docker engine answers, docker-compose.yml is used. Otherwise the Debian packages
# rabbitmq-server and zookeeper run as plain processes, installed with apt-get when missing
# and the user is root. All their state lives under $HASHQ_SERVICES_DIR (default
# .services/ in the checkout); everything listens on 127.0.0.1 only.
#
# One invocation can also run one member of a local cluster (for failover tests), with one
# HASHQ_SERVICES_DIR and distinct ports per member:
#   HASHQ_SERVICES_RABBIT_NODE    this member's node name (default rabbit@localhost)
#   HASHQ_SERVICES_RABBIT_JOIN    a node to cluster with on first start (it may still be starting)
#   HASHQ_SERVICES_ERLANG_COOKIE  the cookie all members share
#   HASHQ_SERVICES_EPMD_PORT      one epmd port all members share
#   HASHQ_SERVICES_ZK_ENSEMBLE    e.g. 1=127.0.0.1:2891:3891,2=127.0.0.1:2892:3892,...
#   HASHQ_SERVICES_ZK_MYID        this member's number in it
# An ensemble member answers only once a quorum runs: start the members concurrently.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STATE=${HASHQ_SERVICES_DIR:-$ROOT/.services}
AMQP_PORT=${HASHQ_SERVICES_AMQP_PORT:-5672}
MGMT_PORT=${HASHQ_SERVICES_MANAGEMENT_PORT:-15672}
ZK_PORT=${HASHQ_SERVICES_ZK_PORT:-2181}
DIST_PORT=$((AMQP_PORT + 20000))
# A private epmd port, so that stopping ours never disturbs another Erlang node on the machine.
EPMD_PORT=${HASHQ_SERVICES_EPMD_PORT:-4371}
# TLS listeners (amqps:// and the management API over https) that require a client certificate
# from the CA this script makes under $STATE/tls; HASHQ_SERVICES_TLS=0 leaves them out.
TLS=${HASHQ_SERVICES_TLS:-1}
AMQPS_PORT=${HASHQ_SERVICES_AMQPS_PORT:-$((AMQP_PORT + 1000))}
MGMT_TLS_PORT=${HASHQ_SERVICES_MANAGEMENT_TLS_PORT:-$((MGMT_PORT + 1000))}
RABBIT_NODE=${HASHQ_SERVICES_RABBIT_NODE:-rabbit@localhost}
RABBIT_JOIN=${HASHQ_SERVICES_RABBIT_JOIN:-}
ERLANG_COOKIE=${HASHQ_SERVICES_ERLANG_COOKIE:-}
ZK_ENSEMBLE=${HASHQ_SERVICES_ZK_ENSEMBLE:-}
ZK_MYID=${HASHQ_SERVICES_ZK_MYID:-}
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
    # libfaketime, for the chaos run's clock steps (tools/chaos/clock.py)
    compgen -G '/usr/lib/*/faketime/libfaketime.so.1' >/dev/null || missing+=(faketime)
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
    export RABBITMQ_NODENAME=$RABBIT_NODE RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
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
    [ "$TLS" = 0 ] || tls_files
    rabbit_config >"$dir/rabbitmq.conf"
    rabbit_env
    rabbit_cookie
    "$RABBIT_BIN/rabbitmq-plugins" enable --offline rabbitmq_consistent_hash_exchange rabbitmq_management rabbitmq_event_exchange >/dev/null
    say "starting rabbitmq on 127.0.0.1:$AMQP_PORT (management $MGMT_PORT)"
    setsid "$RABBIT_BIN/rabbitmq-server" -detached >"$dir/log/start.out" 2>&1
    "$RABBIT_BIN/rabbitmqctl" wait --timeout 120 "$RABBITMQ_PID_FILE" >/dev/null \
        || die "rabbitmq did not start; see $dir/log"
    "$RABBIT_BIN/rabbitmqctl" await_startup --timeout 120 >/dev/null
    wait_for "rabbitmq management API" 60 rabbit_answers
    [ -z "$RABBIT_JOIN" ] || rabbit_joined || die "$RABBIT_NODE did not join $RABBIT_JOIN; see $dir/log"
}

rabbit_config() {
    cat <<EOF
listeners.tcp.default = 127.0.0.1:$AMQP_PORT
management.tcp.ip = 127.0.0.1
management.tcp.port = $MGMT_PORT
loopback_users = none
disk_free_limit.absolute = 256MB
collect_statistics_interval = 1000
EOF
    [ -z "$RABBIT_JOIN" ] || rabbit_discovery_config
    [ "$TLS" = 0 ] || rabbit_tls_config
}

rabbit_tls_config() {
    local tls=$STATE/tls
    cat <<EOF
listeners.ssl.default = 127.0.0.1:$AMQPS_PORT
ssl_options.cacertfile = $tls/ca.pem
ssl_options.certfile = $tls/server.pem
ssl_options.keyfile = $tls/server.key
ssl_options.verify = verify_peer
ssl_options.fail_if_no_peer_cert = true
management.ssl.ip = 127.0.0.1
management.ssl.port = $MGMT_TLS_PORT
management.ssl.cacertfile = $tls/ca.pem
management.ssl.certfile = $tls/server.pem
management.ssl.keyfile = $tls/server.key
management.ssl.verify = verify_peer
management.ssl.fail_if_no_peer_cert = true
EOF
}

# A private CA, a server certificate for localhost and 127.0.0.1, and a client certificate;
# made once, kept with the rest of the state.
tls_files() {
    local tls=$STATE/tls
    [ -s "$tls/client.pem" ] && return 0
    mkdir -p "$tls"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=hashq test CA" \
        -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
        -keyout "$tls/ca.key" -out "$tls/ca.pem" 2>/dev/null
    tls_leaf server localhost "subjectAltName=DNS:localhost,IP:127.0.0.1
extendedKeyUsage=serverAuth"
    tls_leaf client hashq-client "extendedKeyUsage=clientAuth"
}

tls_leaf() {
    local tls=$STATE/tls name=$1 subject=$2 extensions=$3
    openssl req -newkey rsa:2048 -nodes -subj "/CN=$subject" \
        -keyout "$tls/$name.key" -out "$tls/$name.csr" 2>/dev/null
    printf '%s\nauthorityKeyIdentifier=keyid\nsubjectKeyIdentifier=hash\n' "$extensions" >"$tls/$name.ext"
    openssl x509 -req -in "$tls/$name.csr" -CA "$tls/ca.pem" -CAkey "$tls/ca.key" -CAcreateserial \
        -days 3650 -extfile "$tls/$name.ext" -out "$tls/$name.pem" 2>/dev/null
    rm -f "$tls/$name.csr" "$tls/$name.ext"
}

# Peer discovery rather than join_cluster: measured faster (no second boot of the app), and it
# waits for a node to join that is still starting (tables_not_present is retried), so members
# can start together. Only a node with an empty database uses it: a restarted member rejoins
# from its own state.
rabbit_discovery_config() {
    cat <<EOF
cluster_formation.peer_discovery_backend = classic_config
cluster_formation.classic_config.nodes.1 = $RABBIT_JOIN
cluster_formation.discovery_retry_limit = 240
cluster_formation.discovery_retry_interval = 500
EOF
}

# Members of one cluster must share the cookie; the file must not be readable by others.
rabbit_cookie() {
    [ -n "$ERLANG_COOKIE" ] || return 0
    local file=$STATE/rabbitmq/.erlang.cookie
    rm -f "$file"
    (umask 277 && printf '%s' "$ERLANG_COOKIE" >"$file")
}

rabbit_down() {
    local dir=$STATE/rabbitmq
    [ -s "$dir/rabbit.pid" ] || { say "rabbitmq: not started by this script"; return 0; }
    rabbit_env
    if rabbit_alive; then
        say "stopping rabbitmq"
        "$RABBIT_BIN/rabbitmqctl" shutdown --timeout 60 >/dev/null 2>&1 || kill "$(cat "$dir/rabbit.pid")" 2>/dev/null || true
    fi
    epmd_release
    rm -f "$dir/rabbit.pid"
}

# Discovery gives up after its retries and boots the node alone: check that it did join.
rabbit_joined() {
    curl -fsS -m 3 -u guest:guest "http://127.0.0.1:$MGMT_PORT/api/nodes" 2>/dev/null \
        | grep -qF "\"name\":\"$RABBIT_JOIN\""
}

rabbit_kill() { kill_pidfile rabbitmq "$STATE/rabbitmq/rabbit.pid"; }

epmd_names() { epmd -port "$EPMD_PORT" -names 2>/dev/null | awk '$1 == "name" { print $2 }'; }

# epmd outlives the node; ours listens on a private port, so this stops only ours, and only
# once no other member of a cluster sharing it is still registered.
epmd_release() {
    for _ in $(seq 50); do epmd_names | grep -qx "${RABBIT_NODE%@*}" || break; sleep 0.1; done
    [ -z "$(epmd_names)" ] || return 0
    epmd -port "$EPMD_PORT" -kill >/dev/null 2>&1 || true
}

# ---------------------------------------------------------------- zookeeper
zk_alive() {
    local pidfile=$STATE/zookeeper/zk.pid
    [ -s "$pidfile" ] && pid_running "$(cat "$pidfile")"
}

zk_answers() {
    local reply
    reply=$(timeout 3 bash -c "exec 3<>/dev/tcp/127.0.0.1/$ZK_PORT; printf srvr >&3; cat <&3" 2>/dev/null) || return 1
    if [ -n "$ZK_ENSEMBLE" ]; then
        [[ $reply == *"Mode: leader"* || $reply == *"Mode: follower"* ]]
    else
        [[ $reply == *"Mode: standalone"* ]]
    fi
}

zk_up() {
    local dir=$STATE/zookeeper
    if zk_alive; then say "zookeeper already running (pid $(cat "$dir/zk.pid"))"; return 0; fi
    wait_port_free "$ZK_PORT" || die "port $ZK_PORT is taken by another process; set HASHQ_SERVICES_ZK_PORT"
    mkdir -p "$dir/data"
    zk_config >"$dir/zoo.cfg"
    say "starting zookeeper on 127.0.0.1:$ZK_PORT"
    # setsid: the server must not belong to the caller's process group, which a test harness
    # may kill as a whole.
    setsid nohup java -Xmx256m -cp "$ZK_JARS" "$(zk_main_class)" \
        "$dir/zoo.cfg" >"$dir/zookeeper.log" 2>&1 </dev/null &
    echo $! >"$dir/zk.pid"
    wait_for zookeeper 60 zk_answers
}

zk_config() {
    local dir=$STATE/zookeeper
    # A short tick lets tests use short sessions (the minimum session is 2 ticks).
    cat <<EOF
tickTime=500
minSessionTimeout=1000
maxSessionTimeout=60000
dataDir=$dir/data
clientPort=$ZK_PORT
clientPortAddress=127.0.0.1
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr,stat,mntr
EOF
    [ -n "$ZK_ENSEMBLE" ] || return 0
    [ -n "$ZK_MYID" ] || die "HASHQ_SERVICES_ZK_ENSEMBLE needs HASHQ_SERVICES_ZK_MYID"
    echo "$ZK_MYID" >"$dir/data/myid"
    zk_ensemble_config
}

# In ticks: a follower has 5 s to sync at start, and is dropped after 2 s without its leader.
zk_ensemble_config() {
    local member
    echo "initLimit=10"
    echo "syncLimit=4"
    for member in ${ZK_ENSEMBLE//,/ }; do echo "server.$member"; done
}

# ZooKeeperServerMain cannot join an ensemble; QuorumPeerMain can.
zk_main_class() {
    if [ -n "$ZK_ENSEMBLE" ]; then echo org.apache.zookeeper.server.quorum.QuorumPeerMain
    else echo org.apache.zookeeper.server.ZooKeeperServerMain; fi
}

zk_kill() { kill_pidfile zookeeper "$STATE/zookeeper/zk.pid"; }

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
# Removes the pid file: a later pid of that number may be anyone's.
kill_pidfile() {
    local what=$1 pidfile=$2 pid
    [ -s "$pidfile" ] || { say "$what: not started by this script"; return 0; }
    pid=$(cat "$pidfile")
    if pid_running "$pid"; then say "killing $what (pid $pid)"; kill -9 "$pid" 2>/dev/null || true; fi
    for _ in $(seq 100); do pid_running "$pid" || break; sleep 0.05; done
    rm -f "$pidfile"
}

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
    if [ "$TLS" != 0 ] && ! use_docker; then
        echo "export HASHQ_SERVICES_TLS_DIR=$STATE/tls"
        echo "export HASHQ_SERVICES_AMQPS_PORT=$AMQPS_PORT"
        echo "export HASHQ_SERVICES_MANAGEMENT_TLS_PORT=$MGMT_TLS_PORT"
    fi
}

# rabbit-eval EXPR: evaluate an Erlang expression in the local broker (tests change settings at
# run time this way, e.g. consumer_timeout). Local servers only.
rabbit_eval() {
    use_docker && die "rabbit-eval works with the local servers only"
    rabbit_alive || die "rabbitmq is not running"
    rabbit_env
    "$RABBIT_BIN/rabbitmqctl" eval "$1"
}

# pause|resume rabbitmq: SIGSTOP or SIGCONT the local broker, which then answers nothing while
# every connection stays open (tests of a broker that stops answering). Local servers only.
rabbit_signal() {
    use_docker && die "pause and resume work with the local servers only"
    rabbit_alive || die "rabbitmq is not running"
    kill "-$1" "$(cat "$STATE/rabbitmq/rabbit.pid")"
}

main() {
    local cmd=${1:-status} target=${2:-}
    if [ "$cmd" = rabbit-eval ]; then rabbit_eval "$target"; return; fi
    if [ "$cmd" = pause ] && [ "$target" = rabbitmq ]; then rabbit_signal STOP; return; fi
    if [ "$cmd" = resume ] && [ "$target" = rabbitmq ]; then rabbit_signal CONT; return; fi
    case "$target" in ""|rabbitmq|zookeeper) ;; *) die "unknown service '$target' (rabbitmq or zookeeper)";; esac
    case "$cmd" in
        up|down|restart|kill)
            if use_docker; then
                local services; services=$(targets "$target")
                case "$cmd" in
                    up) docker compose -f "$ROOT/docker-compose.yml" up -d --wait $services ;;
                    down) if [ -n "$target" ]; then docker compose -f "$ROOT/docker-compose.yml" stop $services
                          else docker compose -f "$ROOT/docker-compose.yml" down; fi ;;
                    restart) docker compose -f "$ROOT/docker-compose.yml" restart $services
                             docker compose -f "$ROOT/docker-compose.yml" up -d --wait $services ;;
                    kill) docker compose -f "$ROOT/docker-compose.yml" kill -s KILL $services ;;
                esac
                return
            fi
            [ "$cmd" = down ] || [ "$cmd" = kill ] || ensure_packages
            for t in $(targets "$target"); do
                case "$cmd" in
                    up) "${t}_up" ;;
                    down) "${t}_down" ;;
                    restart) "${t}_down"; "${t}_up" ;;
                    kill) "${t}_kill" ;;
                esac
            done ;;
        status) status ;;
        env) print_env ;;
        *) die "usage: $0 up|down|restart|kill|status|env [rabbitmq|zookeeper], pause|resume rabbitmq, or rabbit-eval EXPR" ;;
    esac
}

# Function names per service, so that main can dispatch on the name.
rabbitmq_up() { rabbit_up; }
rabbitmq_down() { rabbit_down; }
zookeeper_up() { zk_up; }
zookeeper_down() { zk_down; }
rabbitmq_kill() { rabbit_kill; }
zookeeper_kill() { zk_kill; }

main "$@"
