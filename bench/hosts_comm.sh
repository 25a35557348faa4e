#!/usr/bin/env bash
# Bus bandwidth inside a host and across hosts, on the hosts of scripts/hosts.sh: two ranks
# on one host (Open MPI's shared-memory transport), one rank on each of two hosts (TCP over
# the host's shaped link), then two ranks on each (one group over every slot, as ZeRO's dp
# groups run), then two ranks on each in two concurrent pairs across the link (ranks 0+2 and
# 1+3, sharing each host's NIC, as tp2·dp2's dp groups with tp inside a host) and two
# concurrent pairs inside the hosts (its tp groups), through meshtrain's comm layer (meshtrain_bench_comm, nccl-tests' busbw). Brings the hosts up with link rate RATE and takes them down after.
# Usage: bench/hosts_comm.sh [RATE (default 1gbit)] [flags of meshtrain_bench_comm ...]
# Needs root (network namespaces).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
rate="${1:-1gbit}"
[ $# -gt 0 ] && shift
hosts="$root/scripts/hosts.sh"
name=mtb net=10.231.8
"$hosts" up 2 --rate "$rate" --name $name --net $net >/dev/null
dir="$(mktemp -d)"
trap '"$hosts" down --name $name; rm -rf "$dir"' EXIT
echo "${name}0 slots=2" >"$dir/one_host"
printf '%s0 slots=1\n%s1 slots=1\n' $name $name >"$dir/two_hosts"
printf '%s0 slots=2\n%s1 slots=2\n' $name $name >"$dir/two_by_two"
# shellcheck disable=SC2046
run() { OMP_NUM_THREADS=1 mpirun --allow-run-as-root -n "${ranks:-2}" --bind-to none --oversubscribe --hostfile "$1" -x OMP_NUM_THREADS \
          $("$hosts" mpirun-args --name $name --net $net) "$root/build/meshtrain_bench_comm" "${@:2}"; }
echo "== intra-host: 2 ranks on ${name}0 (shared memory)"
run "$dir/one_host" "$@"
echo "== inter-host: 1 rank on each of ${name}0, ${name}1 (TCP, links shaped to $rate)"
run "$dir/two_hosts" "$@"
echo "== inter-host, every slot: 2 ranks on each of ${name}0, ${name}1 (one group of 4)"
ranks=4 run "$dir/two_by_two" "$@"
echo "== inter-host, two pairs at once: ranks 0+2 and 1+3 across ${name}0, ${name}1 (each pair's N is 2)"
ranks=4 run "$dir/two_by_two" --groups 2 "$@"
echo "== intra-host, every slot: ranks 0+1 on ${name}0 and 2+3 on ${name}1 at once (shared memory)"
ranks=4 run "$dir/two_by_two" --groups 2 --blocks 1 "$@"
