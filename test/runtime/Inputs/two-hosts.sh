#!/bin/bash
# Two simulated hosts on one machine (two-hosts.test): two network
# namespaces, each with its own host name, joined to the root namespace by
# veth pairs on a bridge. mpirun runs in the root namespace with one rank on
# each "host", over TCP only, launching its daemons through an agent script
# that enters the host's namespace (where ssh would log in elsewhere).
#
#   two-hosts.sh MODE DIR [--no-keepalive] [--delay-ms D] KILN-RUN-ARGS...
#
# MODE: run        mpirun kiln-run KILN-RUN-ARGS, one rank per host
#       kill-host  the same; once a step is logged, kill every process in
#                  host B's namespace (its daemon and rank)
#       cut-link   the same; once a step is logged, take host B's link down
# --delay-ms D: the ranks' data (MPI's TCP transport) goes over a second
# link between the hosts that delays every frame by D ms each way: two TAP
# devices joined by delay_link.py (this kernel has no netem), MTU 65000;
# mpirun's own traffic stays on the bridge.
# The job's output goes to DIR/MODE.log; this script prints what happened
# and exits with mpirun's status. Everything it created is removed on exit.
set -u
mode=$1 dir=$2; shift 2
keepalive=(--mca oob_tcp_keepalive_time 1 --mca oob_tcp_keepalive_intvl 1
           --mca oob_tcp_keepalive_probes 3)
delay=""
while :; do
  case "${1:-}" in
    --no-keepalive) keepalive=(); shift ;;
    --delay-ms) delay=$2; shift 2 ;;
    *) break ;;
  esac
done
mkdir -p "$dir"

id=$$
nsa=kiln-a-$id nsb=kiln-b-$id br=kbr$id
# A private /24 of 10.100-199.x, from the PID, that no interface here uses.
for try in 0 1 2 3 4 5 6 7; do
  net=10.$((100 + (id + try) % 100)).$((((id + try) / 100) % 256))
  ip -4 addr | grep -q " inet $net\." || break
done
sub=$net.0/24 ipa=$net.2 ipb=$net.3
# The delayed data link's /24: the next free one.
for try in 8 9 10 11 12 13 14 15; do
  dnet=10.$((100 + (id + try) % 100)).$((((id + try) / 100) % 256))
  [ "$dnet" != "$net" ] && ! ip -4 addr | grep -q " inet $dnet\." && break
done
forwarder=""

cleanup() {
  [ -n "$forwarder" ] && kill "$forwarder" 2>/dev/null
  for ns in "$nsa" "$nsb"; do
    pids=$(ip netns pids "$ns" 2>/dev/null)
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null
    ip netns del "$ns" 2>/dev/null
  done
  ip link del "kva$id" 2>/dev/null
  ip link del "kvb$id" 2>/dev/null
  ip link del "$br" 2>/dev/null
}
trap cleanup EXIT
trap 'exit 130' INT TERM

set -e
ip link add "$br" type bridge
ip addr add "$net.1/24" dev "$br"
ip link set "$br" up
for h in a b; do
  ns=kiln-$h-$id
  ip netns add "$ns"
  ip link add "kv$h$id" type veth peer name "kp$h$id"
  ip link set "kv$h$id" master "$br" up
  ip link set "kp$h$id" netns "$ns"
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add "$net.$([ $h = a ] && echo 2 || echo 3)/24" dev "kp$h$id"
  ip -n "$ns" link set "kp$h$id" up
done
data_sub=$sub
if [ -n "$delay" ]; then
  python3 "$(dirname "$0")/delay_link.py" "kta$id" "ktb$id" "$delay" > "$dir/link-$id.out" &
  forwarder=$!
  for _ in $(seq 100); do grep -q ready "$dir/link-$id.out" 2>/dev/null && break; sleep 0.05; done
  for h in a b; do
    ip link set "kt$h$id" netns "kiln-$h-$id"
    ip -n "kiln-$h-$id" addr add "$dnet.$([ $h = a ] && echo 2 || echo 3)/24" dev "kt$h$id"
    ip -n "kiln-$h-$id" link set "kt$h$id" mtu 65000 up
  done
  data_sub=$dnet.0/24
fi
set +e

# The launch agent: called as `agent HOST COMMAND...` (like ssh), it runs
# the command in HOST's namespace under a host name of its own.
agent=$dir/agent-$id.sh
cat > "$agent" <<AGENT
#!/bin/sh
host=\$1; shift
case \$host in
  $ipa) ns=$nsa name=kiln-host-a ;;
  $ipb) ns=$nsb name=kiln-host-b ;;
  *) echo "agent: no simulated host \$host" >&2; exit 1 ;;
esac
exec ip netns exec \$ns unshare --uts sh -c 'hostname "\$0" && exec sh -c "\$1"' \$name "\$*"
AGENT
chmod +x "$agent"

log=$dir/$mode.log
timeout -k 5 "${TWO_HOSTS_TIMEOUT:-60}" mpirun --allow-run-as-root -np 2 --host "$ipa,$ipb" --bind-to none \
  --mca plm_rsh_agent "$agent" --mca plm_rsh_no_tree_spawn 1 \
  --mca btl self,tcp --mca btl_tcp_if_include "$data_sub" --mca oob_tcp_if_include "$sub" \
  "${keepalive[@]}" kiln-run "$@" > "$log" 2>&1 &
job=$!

if [ "$mode" != run ]; then
  # Mid-run: once a step is logged.
  for _ in $(seq 600); do
    grep -q '^ *step ' "$log" 2>/dev/null && break
    kill -0 $job 2>/dev/null || break
    sleep 0.1
  done
  if ! grep -q '^ *step ' "$log"; then
    echo "two-hosts: no step logged before the job ended"; wait $job; exit 1
  fi
  start=$EPOCHREALTIME
  case $mode in
    kill-host) kill -9 $(ip netns pids "$nsb") ;;
    cut-link)  ip -n "$nsb" link set "kpb$id" down ;;
  esac
  echo "two-hosts: $mode while running"
fi
wait $job; rc=$?
if [ "$mode" != run ]; then
  echo "two-hosts: job ended with status $rc after $(awk "BEGIN { printf \"%.1f\", $EPOCHREALTIME - $start }") s"
else
  echo "two-hosts: job ended with status $rc"
fi
exit $rc
