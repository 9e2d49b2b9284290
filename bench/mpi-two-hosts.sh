#!/usr/bin/env bash
# Two "machines" on one box: MPI ranks in two network namespaces with their own host names
# (h1, h2), joined by a veth pair (10.200.0.1/24 <-> 10.200.0.2/24), 2 ranks per host, TCP only.
# mpirun runs in h1; it starts the h2 daemon through a tiny launch agent (instead of ssh) that
# enters h2's network namespace and a fresh UTS namespace named h2.
#
# Usage (root): [LOCALSGD_LINK_RATE=100mbit] bench/mpi-two-hosts.sh <mpi program> [args...]
#   default args: check --expect-hosts 2 (the mpi_check driver of localsgd-comm)
#   LOCALSGD_LINK_RATE shapes the link in both directions (`tc ... tbf rate RATE burst 256kb
#   latency 50ms`, a tc rate such as 100mbit or 1gbit); unset: unshaped.
# Only loopback and the two namespaces created here carry traffic. Everything is removed on exit.
set -euo pipefail

prog=${1:?usage: $0 <mpi program> [args...]}
shift
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(check --expect-hosts 2)

id=$$
ns1="lsgd${id}h1"
ns2="lsgd${id}h2"
veth1="vl${id}a"
veth2="vl${id}b"
work=$(mktemp -d /tmp/mpi-two-hosts.XXXXXX)

cleanup() {
  ip netns del "$ns1" 2>/dev/null || true
  ip netns del "$ns2" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

ip netns add "$ns1"
ip netns add "$ns2"
ip link add "$veth1" type veth peer name "$veth2"
ip link set "$veth1" netns "$ns1"
ip link set "$veth2" netns "$ns2"
ip -n "$ns1" addr add 10.200.0.1/24 dev "$veth1"
ip -n "$ns2" addr add 10.200.0.2/24 dev "$veth2"
for ns in "$ns1" "$ns2"; do
  ip -n "$ns" link set lo up
done
ip -n "$ns1" link set "$veth1" up
ip -n "$ns2" link set "$veth2" up
if [ -n "${LOCALSGD_LINK_RATE:-}" ]; then
  tc -n "$ns1" qdisc add dev "$veth1" root tbf rate "$LOCALSGD_LINK_RATE" burst 256kb latency 50ms
  tc -n "$ns2" qdisc add dev "$veth2" root tbf rate "$LOCALSGD_LINK_RATE" burst 256kb latency 50ms
fi

# Launch agent used by mpirun in place of ssh: `agent <host> <command words...>`.
cat > "$work/agent" <<AGENT
#!/usr/bin/env bash
host=\$1; shift
case "\$host" in
  10.200.0.1) ns=$ns1; name=h1 ;;
  10.200.0.2) ns=$ns2; name=h2 ;;
  *) echo "mpi-two-hosts agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" unshare --uts sh -c "hostname \$name && \$*"
AGENT
chmod +x "$work/agent"

cat > "$work/hostfile" <<HOSTS
10.200.0.1 slots=2
10.200.0.2 slots=2
HOSTS

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Open MPI believes each "host" has 2 cores of its own, so its waiting ranks spin. When the 4
# ranks share fewer real cores, spinning ranks starve the ones with work (and anything else on
# the machine): let a waiting rank yield its core instead.
yield=()
if [ "$(nproc)" -lt 4 ]; then
  yield=(--mca mpi_yield_when_idle 1)
fi
# shellcheck disable=SC2016
exec_in_h1=(ip netns exec "$ns1" unshare --uts sh -c 'hostname h1 && exec "$@"' sh)
timeout 120 "${exec_in_h1[@]}" mpirun \
  --hostfile "$work/hostfile" -np 4 --map-by slot \
  --mca plm_rsh_agent "$work/agent" \
  --mca plm_rsh_no_tree_spawn 1 \
  --mca btl tcp,self \
  --mca btl_tcp_if_include 10.200.0.0/24 \
  --mca oob_tcp_if_include 10.200.0.0/24 \
  "${yield[@]}" \
  "$prog" "${args[@]}"
