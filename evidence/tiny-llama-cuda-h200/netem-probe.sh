#!/bin/bash
# netem probe with Debian 12 iproute2 (ip, tc) carried; the device image has neither.
D=$(cd "$(dirname "$0")" && pwd); OUT=${OUT:-/tmp/o}; mkdir -p $OUT
{
uname -r; id -u
export LD_LIBRARY_PATH=$D/lib
IP=$D/bin/ip; TC=$D/bin/tc
$IP -V; $TC -V
ls /proc/config.gz 2>&1 && zcat /proc/config.gz | grep -E "NETEM|NET_SCHED|NET_NS=|CONFIG_VETH" 
ls /sys/module 2>/dev/null | grep -iE "netem|sch_" ; ls /lib/modules/$(uname -r) 2>&1 | head -3; command -v modprobe unshare
echo "--- brief's probe"
timeout 20 $IP netns add dgrprobe && timeout 20 $IP netns exec dgrprobe $IP link set lo up && timeout 20 $IP netns exec dgrprobe $TC qdisc add dev lo root netem delay 1ms; echo "rc=$?"
timeout 20 $IP netns exec dgrprobe $TC qdisc show dev lo
timeout 20 $IP netns exec dgrprobe ping -c 3 -i 0.2 127.0.0.1 2>&1 | tail -2
timeout 20 $IP netns del dgrprobe; echo "del rc=$?"
echo "--- veth pair (what a namespaced pipeline would need)"
timeout 20 $IP netns add a && timeout 20 $IP netns add b && timeout 20 $IP link add va type veth peer name vb; echo "veth rc=$?"
timeout 20 $IP link set va netns a; timeout 20 $IP link set vb netns b
timeout 20 $IP netns exec a $IP addr add 10.9.0.1/24 dev va; timeout 20 $IP netns exec b $IP addr add 10.9.0.2/24 dev vb
timeout 20 $IP netns exec a $IP link set va up; timeout 20 $IP netns exec b $IP link set vb up
timeout 20 $IP netns exec a $TC qdisc add dev va root netem delay 5ms rate 100mbit; echo "netem rate rc=$?"
timeout 20 $IP netns exec a python3 -c "
import socket,time,subprocess
" ; timeout 20 $IP netns exec a ping -c 3 -i 0.2 10.9.0.2 2>&1 | tail -2
timeout 20 $IP netns del a; timeout 20 $IP netns del b
} 2>&1 | tee $OUT/netem.txt
