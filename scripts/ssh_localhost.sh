#!/usr/bin/env bash
# Prompt-free ssh from this machine to itself under extra host names, so that
# `horovodrun -H localhost:1,dane-node2:1` runs Horovod's real multi-host path on one
# machine (tests/test_multihost.py).  Idempotent: a second run changes nothing.
#
# horovodrun counts a host as local when its name resolves to an address of one of this
# machine's interfaces (psutil); `localhost`, 127.0.0.1 and the machine's own name do.
# Any other loopback address (127.0.0.2, ...) is on no interface, so a name for it is a
# remote host: horovodrun checks ssh to it, starts its worker over ssh, and the gloo
# rendezvous and allreduce go over TCP between the "hosts" as they would between machines.
#
#   bash scripts/ssh_localhost.sh            # aliases dane-node2 -> 127.0.0.2, dane-node3 -> 127.0.0.3
#   DANE_SSH_HOSTS="a b" bash scripts/ssh_localhost.sh   # a -> 127.0.0.2, b -> 127.0.0.3
#   bash scripts/ssh_localhost.sh --undo     # takes back what a run added (same DANE_SSH_HOSTS)
#
# What it changes: installs openssh-server if missing; makes ~/.ssh/id_ed25519 (comment
# dane-localhost) unless a key is there, and authorizes it; adds one /etc/hosts line and one
# ~/.ssh/config block (marked "# dane-localhost: <host>") per alias; starts sshd if nothing
# listens on port 22.  It notes in ~/.ssh/dane-localhost.state what it made, so that --undo
# removes exactly that (the aliases' lines and blocks, the key and its authorization if it made
# them, and the sshd it started), leaving the package installed.
#
# Needs root (or sudo without a password) for apt-get, /etc/hosts and sshd; the key is the
# current user's.  Each step that fails stops with one line on stderr and status 1.
set -euo pipefail

HOSTS=${DANE_SSH_HOSTS:-"dane-node2 dane-node3"}
SSH_DIR="$HOME/.ssh"
KEY="$SSH_DIR/id_ed25519"
STATE="$SSH_DIR/dane-localhost.state"   # "key" (the key was made here), "sshd <pid>" (sshd was started here)

die() { echo "ssh_localhost: $*" >&2; exit 1; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"
    elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo -n "$@"
    else die "'$*' needs root; run this script as root or with password-free sudo"
    fi
}

undo() {
    [ -f "$STATE" ] || { echo "ssh_localhost: nothing to undo ($STATE is absent)"; return 0; }
    local kind a b
    while read -r kind a b; do
        case "$kind" in
            hosts)  # "hosts <addr> <alias>"; /etc/hosts may be a bind mount (containers): rewrite it in place
                grep -vxF "$a $b" /etc/hosts > "$SSH_DIR/hosts.dane" || true
                as_root sh -c "cat '$SSH_DIR/hosts.dane' > /etc/hosts" || die "could not remove '$a $b' from /etc/hosts"
                rm -f "$SSH_DIR/hosts.dane" ;;
            config)  # "config <alias>": the marker line and the four lines after it
                awk -v mark="# dane-localhost: $a" '$0 == mark {skip = 5} skip > 0 {skip--; next} {print}' \
                    "$SSH_DIR/config" > "$SSH_DIR/config.dane" && cat "$SSH_DIR/config.dane" > "$SSH_DIR/config"
                rm -f "$SSH_DIR/config.dane" ;;
            key)  # the key this script made, and its line in authorized_keys
                if [ -f "$KEY.pub" ] && [ -f "$SSH_DIR/authorized_keys" ]; then
                    grep -vxF "$(cat "$KEY.pub")" "$SSH_DIR/authorized_keys" > "$SSH_DIR/authorized_keys.dane" || true
                    cat "$SSH_DIR/authorized_keys.dane" > "$SSH_DIR/authorized_keys"
                    rm -f "$SSH_DIR/authorized_keys.dane"
                fi
                rm -f "$KEY" "$KEY.pub" ;;
            sshd)  # "sshd <pid>": the daemon this script started
                if [ -n "$a" ] && kill -0 "$a" 2>/dev/null; then as_root kill "$a" || die "could not stop sshd (pid $a)"; fi ;;
        esac
    done < "$STATE"
    echo "ssh_localhost: undone: $(paste -sd ';' "$STATE")"
    rm -f "$STATE"
}

if [ "${1:-}" = "--undo" ]; then
    undo
    exit 0
elif [ $# -gt 0 ]; then
    die "unknown argument '$1'; run without arguments to set up, or with --undo to take it back"
fi

# 1. sshd
if [ ! -x /usr/sbin/sshd ]; then
    echo "ssh_localhost: installing openssh-server"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q openssh-server >/dev/null 2>&1 \
        || { as_root apt-get update -q >/dev/null 2>&1 \
             && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q openssh-server >/dev/null 2>&1; } \
        || die "apt-get install openssh-server failed; install it by hand and rerun"
fi
command -v ssh >/dev/null || die "no ssh client; apt-get install openssh-client"

# 2. a key for this user, authorized for logins to this user
mkdir -p "$SSH_DIR" && chmod 700 "$SSH_DIR"
if [ ! -f "$KEY" ]; then
    ssh-keygen -q -t ed25519 -N "" -C "dane-localhost" -f "$KEY" >/dev/null || die "ssh-keygen could not write $KEY"
    echo key >> "$STATE"
fi
touch "$SSH_DIR/authorized_keys" && chmod 600 "$SSH_DIR/authorized_keys"
grep -qxF "$(cat "$KEY.pub")" "$SSH_DIR/authorized_keys" || cat "$KEY.pub" >> "$SSH_DIR/authorized_keys"

# 3. host aliases on loopback addresses other than 127.0.0.1 (which horovodrun would take for local)
octet=2
for host in $HOSTS; do
    addr="127.0.0.$octet"
    octet=$((octet + 1))
    current=$(getent ahostsv4 "$host" 2>/dev/null | awk 'NR==1 {print $1}' || true)
    if [ -z "$current" ]; then
        echo "$addr $host" | as_root tee -a /etc/hosts >/dev/null || die "could not add '$addr $host' to /etc/hosts"
        echo "hosts $addr $host" >> "$STATE"
    elif [ "$current" != "$addr" ]; then
        die "$host already resolves to $current, not $addr; remove it from /etc/hosts or set DANE_SSH_HOSTS"
    fi
done

# 4. ssh to the aliases without prompts: their host keys are this machine's, accepted once
touch "$SSH_DIR/config" && chmod 600 "$SSH_DIR/config"
for host in $HOSTS; do
    grep -qxF "# dane-localhost: $host" "$SSH_DIR/config" || { printf '%s\n' "# dane-localhost: $host" "Host $host" \
        "    StrictHostKeyChecking accept-new" "    IdentityFile $KEY" "    BatchMode yes" >> "$SSH_DIR/config" \
        && echo "config $host" >> "$STATE"; }
done

# 5. start sshd unless one answers on port 22
listening() { (exec 3<>/dev/tcp/127.0.0.1/22) 2>/dev/null; }
if ! listening; then
    as_root ssh-keygen -A >/dev/null || die "ssh-keygen -A could not make the host keys"
    as_root mkdir -p /run/sshd
    as_root /usr/sbin/sshd || die "sshd did not start; run /usr/sbin/sshd -d to see why"
    for _ in 1 2 3 4 5 6 7 8 9 10; do listening && break; sleep 0.5; done
    listening || die "sshd started but nothing listens on port 22"
    echo "sshd $(cat /run/sshd.pid 2>/dev/null || pgrep -o -x sshd)" >> "$STATE"
fi

# 6. check every alias, as horovodrun will (password logins off)
for host in $HOSTS; do
    ssh -o PasswordAuthentication=no -o BatchMode=yes -o ConnectTimeout=10 "$host" true 2>/dev/null \
        || die "ssh $host true failed; try ssh -v $host true"
done
echo "ssh_localhost: ssh to $HOSTS works (undo: bash scripts/ssh_localhost.sh --undo); try: horovodrun -np 2 -H localhost:1,${HOSTS%% *}:1 --gloo --network-interface lo ..."
