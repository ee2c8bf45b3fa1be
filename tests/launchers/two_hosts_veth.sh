#!/usr/bin/env bash
# `mpirun` across two "hosts" gives the one-process run's losses and weights to the dist tests'
# tolerances, and mpirun's on one host bit for bit (dp 2 x tp 2; parity_case.sh). The hosts are two network namespaces joined by a veth pair (10.213.77.1 and
# .2), each with its own hostname (a UTS namespace); mpirun starts in the first and reaches the
# second through an rsh agent that does `ip netns exec` where a cluster would use ssh. Ranks
# talk over TCP on the veth only (btl tcp,self: no shared memory between the hosts, ob1 rather
# than UCX, which would pick its own transports), two ranks per host. The trap deletes both
# namespaces, which deletes the veth pair with them.
# Exits 77 (ctest: Skipped) when it cannot run here: not root, or no ip/unshare, or the kernel
# refuses network namespaces or veth pairs.
# Usage: two_hosts_veth.sh <mpiexec> <path to loom>
set -u
mpiexec=${1:?usage: two_hosts_veth.sh <mpiexec> <loom>}
loom=${2:?usage: two_hosts_veth.sh <mpiexec> <loom>}
skip() { echo "two_hosts_veth: SKIPPED: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "needs root to create network namespaces"
for tool in ip unshare hostname; do
  command -v "$tool" >/dev/null || skip "$tool not found (apt-get install iproute2 util-linux)"
done

dir=$(mktemp -d /tmp/loom_hosts.XXXXXX)
tag=$$
ns_a="loom-$tag-a"
ns_b="loom-$tag-b"
addr_a=10.213.77.1
addr_b=10.213.77.2
subnet=10.213.77.0/24
cleanup() {
  ip netns del "$ns_a" 2>/dev/null
  ip netns del "$ns_b" 2>/dev/null
  [ -n "${KEEP:-}" ] || rm -rf "$dir"
}
trap cleanup EXIT
trap "exit 143" INT TERM  # so that the EXIT trap cleans up after a signal too
fail() {
  echo "two_hosts_veth: FAIL: $*"
  for f in "$dir"/*.log; do [ -f "$f" ] && { echo "--- $f ---"; tail -n 40 "$f"; }; done
  exit 1
}
source "$(dirname "$0")/parity_case.sh"

ip netns add "$ns_a" 2>"$dir/netns.log" || skip "ip netns add failed: $(cat "$dir/netns.log")"
ip netns add "$ns_b" || fail "could not create $ns_b"
ip link add "lm${tag}a" type veth peer name "lm${tag}b" 2>"$dir/veth.log" ||
  skip "ip link add ... type veth failed: $(cat "$dir/veth.log")"
ip link set "lm${tag}a" netns "$ns_a" && ip link set "lm${tag}b" netns "$ns_b" || fail "could not move the veth ends"
ip -n "$ns_a" addr add "$addr_a/24" dev "lm${tag}a" && ip -n "$ns_b" addr add "$addr_b/24" dev "lm${tag}b" ||
  fail "could not address the veth ends"
for ns in "$ns_a" "$ns_b"; do
  ip -n "$ns" link set lo up && ip -n "$ns" link set "lm${tag}${ns##*-}" up || fail "could not bring $ns's links up"
done

# The rsh agent: mpirun calls it as `agent HOST COMMAND...` and expects ssh's behaviour (the
# words joined into one line for a shell on HOST).
cat >"$dir/agent.sh" <<AGENT
#!/bin/sh
host=\$1; shift
case "\$host" in
  $addr_a) ns=$ns_a ;;
  $addr_b) ns=$ns_b ;;
  *) echo "agent: unknown host \$host" >&2; exit 255 ;;
esac
exec ip netns exec "\$ns" unshare --uts /bin/sh -c 'hostname "\$1" && exec /bin/sh -c "\$2"' agent "\$ns" "\$*"
AGENT
chmod +x "$dir/agent.sh"

# mpirun as if typed on host a. Ranks 0-1 land on a, 2-3 on b: tp pairs within a host, the dp
# all-reduces across the link, the usual placement on a cluster.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 LOOM_COMM_TIMEOUT_S=60
on_host_a=(ip netns exec "$ns_a" unshare --uts /bin/sh -c 'hostname "$0" && exec "$@"' "$ns_a")
mpi=("$mpiexec" --oversubscribe -np "$PARITY_RANKS" --host "$addr_a:2,$addr_b:2"
  --mca plm_rsh_agent "$dir/agent.sh" --mca pml ob1 --mca btl tcp,self
  --mca btl_tcp_if_include "$subnet" --mca oob_tcp_if_include "$subnet"
  -x OMP_NUM_THREADS -x LOOM_COMM_TIMEOUT_S)

# First where each rank runs: two per namespace, each namespace its own hostname.
timeout 60 "${on_host_a[@]}" "${mpi[@]}" /bin/sh -c \
  'echo "rank $OMPI_COMM_WORLD_RANK $(hostname) $(readlink /proc/self/ns/net)"' >"$dir/where.log" 2>&1 ||
  fail "mpirun across the namespaces failed"
for ns in "$ns_a" "$ns_b"; do
  [ "$(grep -c " $ns net:" "$dir/where.log")" -eq 2 ] || fail "expected 2 ranks on $ns"
done
[ "$(awk '{print $4}' "$dir/where.log" | sort -u | wc -l)" -eq 2 ] || fail "the ranks are not in two network namespaces"

parity_prepare
parity_reference
parity_mpirun_reference "$mpiexec"
rx_before=$(ip -n "$ns_b" -s -j link show "lm${tag}b" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["stats64"]["rx"]["bytes"])')
mapfile -t args < <(parity_train_args hosts parallel)
timeout 150 "${on_host_a[@]}" "${mpi[@]}" "$loom" "${args[@]}" >"$dir/hosts.log" 2>&1 ||
  fail "mpirun -np $PARITY_RANKS loom train across the namespaces exited with $?"
rx_after=$(ip -n "$ns_b" -s -j link show "lm${tag}b" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["stats64"]["rx"]["bytes"])')
parity_compare hosts
# The dp all-reduces cross the link: each of b's two ranks takes in at least its whole gradient
# shard (half the model's weights at tp 2, 4 bytes each) per step, whether the all-reduce is a
# ring (half in the reduce-scatter, half in the all-gather) or recursive doubling (all at once).
weights=$(/usr/bin/python3 -c 'import json,struct,sys
f=open(sys.argv[1],"rb"); h=json.loads(f.read(struct.unpack("<Q",f.read(8))[0]))
print(sum((v["data_offsets"][1]-v["data_offsets"][0])//4 for k,v in h.items() if k!="__metadata__"))' \
  "$dir/single/export/model.safetensors")
least=$((PARITY_STEPS * 2 * weights / PARITY_TP * 4))
[ $((rx_after - rx_before)) -ge "$least" ] ||
  fail "only $((rx_after - rx_before)) bytes reached b over the veth, expected at least $least"
echo "two_hosts_veth: PASS (2 ranks on each of $ns_a and $ns_b, $((rx_after - rx_before)) bytes into b over the veth)"
