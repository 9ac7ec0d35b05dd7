#!/usr/bin/env bash
# Reserve the ports a2-fsdp2 needs, so the kernel never hands them
# out as ephemeral (outgoing) ports:
#   - HCCL host ports 60000-60031 (HCCL_IF_BASE_PORT, 32 ports), used on every node;
#   - the master port 29500 (MASTER_PORT), used on node 0. Reserving it on
#     the other nodes is harmless: a reservation only stops automatic assignment, an
#     explicit bind still works.
#
# Run it on every node:
#   bash sysctl/reserve-ports.sh               dry run: show the merged list, change nothing
#   sudo bash sysctl/reserve-ports.sh --apply      write it now with sysctl -w (lost at reboot)
#   sudo bash sysctl/reserve-ports.sh --permanent  --apply, and keep it in /etc/sysctl.d
#   bash sysctl/reserve-ports.sh --print       print only the merged value
#
# Why merge: `sysctl -w net.ipv4.ip_local_reserved_ports=...` REPLACES the whole list,
# dropping ports other software reserved. This script reads the current list, adds
# ours, and writes the union (sorted, overlapping and adjacent ranges merged).
# NPU_WIZARD_RESERVED_PORTS_FILE and NPU_WIZARD_SYSCTL_DIR override where it reads
# the current list and where --permanent writes its file.
set -euo pipefail

PROJECT=a2-fsdp2
OURS=29500,60000-60031
# HCCL_HOST_SOCKET_PORT_RANGE, where this node sets it, overrides HCCL_IF_BASE_PORT (A2/A3):
# HCCL listens on its ports instead, so those are reserved. sudo drops the environment:
#   sudo HCCL_HOST_SOCKET_PORT_RANGE="$HCCL_HOST_SOCKET_PORT_RANGE" bash sysctl/reserve-ports.sh --apply
port_list='^ *[0-9]+(-[0-9]+)? *(, *[0-9]+(-[0-9]+)? *)*$'
if [[ -n "${HCCL_HOST_SOCKET_PORT_RANGE:-}" ]]; then
    if [[ "${HCCL_HOST_SOCKET_PORT_RANGE// /}" != auto && ! "$HCCL_HOST_SOCKET_PORT_RANGE" =~ $port_list ]]; then
        printf 'HCCL_HOST_SOCKET_PORT_RANGE=%q is not a port list: give ports and ranges with commas (60000-60031,60100) or auto\n' "$HCCL_HOST_SOCKET_PORT_RANGE" >&2
        exit 1
    fi
    if [[ "${HCCL_HOST_SOCKET_PORT_RANGE// /}" == auto ]]; then
        echo "HCCL_HOST_SOCKET_PORT_RANGE=auto: the kernel picks HCCL's host ports, so only the master port is reserved" >&2
        OURS=29500
    else
        echo "HCCL's host ports from HCCL_HOST_SOCKET_PORT_RANGE=$HCCL_HOST_SOCKET_PORT_RANGE, which overrides HCCL_IF_BASE_PORT" >&2
        OURS=29500",$HCCL_HOST_SOCKET_PORT_RANGE"
    fi
fi
RESERVED_FILE="${NPU_WIZARD_RESERVED_PORTS_FILE:-/proc/sys/net/ipv4/ip_local_reserved_ports}"
SYSCTL_DIR="${NPU_WIZARD_SYSCTL_DIR:-/etc/sysctl.d}"
CONF_FILE="$SYSCTL_DIR/90-$PROJECT-ports.conf"
KEY="net.ipv4.ip_local_reserved_ports"

usage() {
    echo "usage: bash sysctl/reserve-ports.sh [--print | --apply | --permanent]"
}

merge_ports() {
    # merge_ports LIST...: the union of comma-separated port lists, in the kernel's
    # canonical form (ascending, overlapping and adjacent ranges merged, "P" or "A-B").
    printf '%s\n' "$@" | tr ',' '\n' | tr -d ' \t\r' | awk -F- '
        $0 == "" { next }
        !/^[0-9]+(-[0-9]+)?$/ { print "not a port or range: " $0 > "/dev/stderr"; bad = 1; next }
        {
            lo = $1 + 0; hi = (NF == 2 ? $2 : $1) + 0
            if (lo > hi || hi > 65535) { print "not a port or range: " $0 > "/dev/stderr"; bad = 1; next }
            print lo, hi
        }
        END { exit bad }' | sort -n -k1,1 -k2,2 | awk '
        function entry(a, b) { return a == b ? a : a "-" b }
        NR == 1 { lo = $1; hi = $2; next }
        $1 <= hi + 1 { if ($2 > hi) hi = $2; next }
        { out = out sep entry(lo, hi); sep = ","; lo = $1; hi = $2 }
        END { if (NR > 0) out = out sep entry(lo, hi); print out }'
}

mode="dry-run"
case "${1:-}" in
    "") ;;
    --print) mode="print" ;;
    --apply) mode="apply" ;;
    --permanent) mode="permanent" ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
esac

if [[ ! -r "$RESERVED_FILE" ]]; then
    echo "cannot read $RESERVED_FILE: is this Linux?" >&2
    exit 1
fi
current="$(merge_ports "$(cat "$RESERVED_FILE")")"
merged="$(merge_ports "$current" "$OURS")"

if [[ "$mode" == "print" ]]; then
    echo "$merged"
    exit 0
fi

echo "reserved now:  ${current:-(none)}"
echo "this project:  $(merge_ports "$OURS")"
echo "merged:        $merged"
if [[ "$merged" == "$current" ]]; then
    echo "already reserved: nothing to change"
fi
if [[ "$mode" == "dry-run" ]]; then
    if [[ "$merged" != "$current" ]]; then
        echo "dry run, nothing changed. To apply: sudo bash sysctl/reserve-ports.sh --apply (or --permanent to keep it after reboot)"
    fi
    exit 0
fi

if [[ "$EUID" -ne 0 ]]; then
    echo "--$mode needs root: run it as sudo bash sysctl/reserve-ports.sh --$mode" >&2
    exit 1
fi
if [[ "$merged" != "$current" ]]; then
    sysctl -w "$KEY=$merged"
fi
if [[ "$mode" == "permanent" ]]; then
    mkdir -p "$SYSCTL_DIR"
    {
        echo "# Written by $PROJECT/sysctl/reserve-ports.sh: reserved ports at that time plus"
        echo "# the project's ($OURS). Only one file can set this key: if another file in"
        echo "# $SYSCTL_DIR sets it too, the last one read wins; merge them by hand."
        echo "$KEY=$merged"
    } >"$CONF_FILE"
    echo "wrote $CONF_FILE (read at boot; \`sysctl --system\` reloads it now)"
fi
