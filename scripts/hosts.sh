#!/usr/bin/env bash
# Hosts on one machine: N Linux network namespaces joined through a bridge, each a "host"
# with its own address, hostname and a shaped link, so that multi-host runs (Open MPI over
# TCP from a hostfile, tp inside a host, dp and pp across hosts) can be run and measured
# here. Needs root (ip netns, tc). Traffic goes only to the addresses assigned below.
#
#   scripts/hosts.sh up N [--rate R] [--name P] [--net A.B.C]  N hosts P0..P(N-1), link rate R
#                                                 (tc tbf, e.g. 1gbit, 100mbit; default none)
#                        [--burst B]              tbf's bucket (default 32kb): bytes that pass
#                                                 at once after the link was idle
#   scripts/hosts.sh down [--name P]              removes them (and every process inside)
#   scripts/hosts.sh exec HOST CMD...             runs CMD on HOST (Open MPI's launch agent:
#                                                 CMD arrives as ssh passes it, one shell string)
#   scripts/hosts.sh rate HOST R|none             reshapes HOST's link
#   scripts/hosts.sh link HOST down|up            takes HOST's link down or up
#   scripts/hosts.sh hostfile [--name P] [--slots S]  prints an Open MPI hostfile
#   scripts/hosts.sh mpirun-args [--name P]       prints the mpirun flags that launch on them
#
# Layout: a bridge P-br in the root namespace at A.B.C.254; host i is namespace P<i> with
# eth0 at A.B.C.(i+1), joined to the bridge by a veth pair whose root end is P<i>-v. The
# rate applies in both directions (tbf on each end of the pair), as a host's NIC on a switch
# would. Ranks of one host share memory (Open MPI's vader transport), as on a real node; the
# filesystem is shared by all hosts, as a cluster's shared filesystem would be. A host's
# processes see its name as their hostname (their own UTS namespace).
set -euo pipefail

name="mt"
net="10.231.7"
rate=""
burst=32kb
slots=2
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

die() { echo "hosts.sh: $*" >&2; exit 2; }
need_root() { [ "$(id -u)" -eq 0 ] || die "needs root (ip netns and tc)"; }

# parse_common ARGS...: --name, --net, --rate, --slots; the rest into `rest`.
rest=()
parse_common() {
  while (($#)); do
    case "$1" in
      --name) name="$2"; shift 2 ;;
      --net) net="$2"; shift 2 ;;
      --rate) rate="$2"; shift 2 ;;
      --burst) burst="$2"; shift 2 ;;
      --slots) slots="$2"; shift 2 ;;
      *) rest+=("$1"); shift ;;
    esac
  done
}

hosts() { ip netns list | awk '{print $1}' | grep -E "^${name}[0-9]+$" | sort -V || true; }

# shape HOST RATE: tbf on both ends of HOST's veth pair ("none" removes it).
shape() {
  local host="$1" r="$2"
  for dev in "$host-v" ; do tc qdisc del dev "$dev" root 2>/dev/null || true; done
  ip netns exec "$host" tc qdisc del dev eth0 root 2>/dev/null || true
  [ "$r" = none ] || [ -z "$r" ] && return 0
  # burst (default 32kb, 0.26 ms at 1 Gbit/s): what passes at the veth's memory speed after
  # the link was idle. A NIC has no such allowance; with 256kb, tp's ~130 KB activations
  # crossed between compute phases faster than the rate, and tp2 dp2 with tp across the
  # link stepped in 166-185 ms against 215-240 at 32kb (2026-12-05, bench/README.md).
  # Larger packets (GSO) are split to fit. latency: queueing delay before tbf drops, kept
  # short so the link behaves like a NIC, not a bufferbloat.
  tc qdisc add dev "$host-v" root tbf rate "$r" burst "$burst" latency 20ms
  ip netns exec "$host" tc qdisc add dev eth0 root tbf rate "$r" burst "$burst" latency 20ms
}

cmd_up() {
  need_root
  local n="${rest[0]:-}"
  [[ "$n" =~ ^[0-9]+$ ]] && ((n >= 1 && n <= 250)) || die "up: give the number of hosts (1-250)"
  [ -z "$(hosts)" ] || cmd_down
  ip link add "$name-br" type bridge
  ip addr add "$net.254/24" dev "$name-br"
  ip link set "$name-br" up
  for ((i = 0; i < n; i++)); do
    local host="$name$i"
    ip netns add "$host"
    ip link add "$host-v" type veth peer name eth0 netns "$host"
    ip link set "$host-v" master "$name-br"
    ip link set "$host-v" up
    ip netns exec "$host" ip link set lo up
    ip netns exec "$host" ip addr add "$net.$((i + 1))/24" dev eth0
    ip netns exec "$host" ip link set eth0 up
    shape "$host" "$rate"
  done
  # The bridge forwards between the hosts; keep the host firewall (if any) out of it.
  [ -w /proc/sys/net/bridge/bridge-nf-call-iptables ] && echo 0 >/proc/sys/net/bridge/bridge-nf-call-iptables || true
  echo "hosts.sh: $n hosts up (${name}0..${name}$((n - 1)) at $net.1..$net.$n${rate:+, links $rate})"
}

cmd_down() {
  need_root
  for host in $(hosts); do
    # Every process still inside (ranks, Open MPI daemons) goes with its host.
    local pids
    pids="$(ip netns pids "$host" 2>/dev/null || true)"
    [ -z "$pids" ] || kill -9 $pids 2>/dev/null || true
    ip link del "$host-v" 2>/dev/null || true
    ip netns del "$host" 2>/dev/null || true
  done
  ip link del "$name-br" 2>/dev/null || true
}

# exec HOST CMD...: the remote shell of Open MPI's rsh launcher. Like ssh, the arguments
# form one command line, run by sh inside the host's namespace under the host's name.
cmd_exec() {
  local host="${rest[0]:-}"
  [ -n "$host" ] || die "exec: give a host"
  ip netns list | awk '{print $1}' | grep -qx "$host" || die "exec: no host '$host' (scripts/hosts.sh up N first)"
  local line="${rest[*]:1}"
  exec ip netns exec "$host" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "$host" "$line"
}

cmd_hostfile() {
  for host in $(hosts); do echo "$host slots=$slots"; done
}

# The flags that make mpirun start its daemons through this script and keep every byte on
# the hosts' network: TCP between hosts, shared memory within one. The hosts share this
# machine's cores, which the hostfile's slots do not say: mpi_yield_when_idle makes a rank
# waiting in a collective yield its core, as Open MPI does by itself when it knows it
# oversubscribes a node. Without it four ranks busy-poll two cores and a small collective
# waits 6-10 ms for its peers to be scheduled, against 0.1-0.16 ms with it
# (bench/hosts_comm.sh, every slot busy).
cmd_mpirun_args() {
  echo "--mca plm_rsh_agent $here/host_agent.sh --mca plm_rsh_no_tree_spawn 1" \
       "--mca oob_tcp_if_include $net.0/24 --mca btl_tcp_if_include $net.0/24 --mca btl self,vader,tcp --mca mpi_yield_when_idle 1"
}

verb="${1:-}"
[ -n "$verb" ] && shift
parse_common "$@"
case "$verb" in
  up) cmd_up ;;
  down) cmd_down ;;
  exec) cmd_exec ;;
  rate) need_root; shape "${rest[0]:?rate: give a host}" "${rest[1]:?rate: give a rate or none}" ;;
  link) need_root; ip link set "${rest[0]:?link: give a host}-v" "${rest[1]:?link: down or up}" ;;
  hostfile) cmd_hostfile ;;
  mpirun-args) cmd_mpirun_args ;;
  *) die "usage: hosts.sh up N | down | exec HOST CMD | rate HOST R | link HOST down|up | hostfile | mpirun-args" ;;
esac
