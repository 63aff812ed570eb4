#!/usr/bin/env bash
# Host discovery for Horovod elastic (horovodrun --host-discovery-script): print the hosts that
# may run workers now, one "host:slots" a line.  horovodrun calls it every few seconds, so editing
# the file while the job runs adds or removes hosts.
#
#   DANE_HOSTS_FILE   a file of hosts, one a line, as horovodrun's --hostfile takes them ("host slots=N")
#                     or as this prints them ("host:N"; a bare "host" is one slot); # comments and blank
#                     lines ignored.  Default: hosts.txt in the repository root (git-ignored), so the
#                     file of the multi-host example serves here as it is.
# Without the file it prints two names of this machine, one slot each: Horovod blacklists a host
# whose worker fails, so two names let one local worker be lost while the other goes on.
#
#   horovodrun --min-np 1 --max-np 2 --host-discovery-script scripts/discover_hosts.sh \
#       python -m experiments.train comm.elastic=true out_dir=results/elastic_run
set -euo pipefail
file="${DANE_HOSTS_FILE:-$(cd "$(dirname "$0")/.." && pwd)/hosts.txt}"
if [[ -f "$file" ]]; then
    awk '/^[[:space:]]*(#|$)/ {next}
         $2 ~ /^slots=[0-9]+$/ {print $1 ":" substr($2, 7); next}
         NF == 1 && $1 ~ /:[0-9]+$/ {print $1; next}
         NF == 1 {print $1 ":1"; next}
         {printf "discover_hosts: %s line %d is neither \"host slots=N\" nor \"host:N\": %s\n", FILENAME, FNR, $0 > "/dev/stderr"; bad = 1}
         END {exit bad}' "$file"
else
    printf 'localhost:1\n127.0.0.1:1\n'
fi
