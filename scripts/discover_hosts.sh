#!/usr/bin/env bash
# Host discovery for Horovod elastic (horovodrun --host-discovery-script): print the hosts that
# may run workers now, one "host:slots" a line.  horovodrun calls it every few seconds, so editing
# the file while the job runs adds or removes hosts.
#
#   DANE_HOSTS_FILE   a file of "host:slots" lines (# comments and blank lines ignored);
#                     default: hosts.txt in the repository root.
# Without the file it prints two names of this machine, one slot each: Horovod blacklists a host
# whose worker fails, so two names let one local worker be lost while the other goes on.
#
#   horovodrun --min-np 1 --max-np 2 --host-discovery-script scripts/discover_hosts.sh \
#       python -m experiments.train comm.elastic=true out_dir=results/elastic_run
set -euo pipefail
file="${DANE_HOSTS_FILE:-$(cd "$(dirname "$0")/.." && pwd)/hosts.txt}"
if [[ -f "$file" ]]; then
    grep -v -e '^[[:space:]]*#' -e '^[[:space:]]*$' "$file" | tr -d '[:blank:]'
else
    printf 'localhost:1\n127.0.0.1:1\n'
fi
