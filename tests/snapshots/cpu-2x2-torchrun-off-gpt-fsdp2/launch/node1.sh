#!/usr/bin/env bash
# cpu-fsdp2: launch script for node 1 of 2 (host IP 127.0.0.1), ranks 2-3 of 4.
# Start every node's script at about the same time (README.md says which runs where).
# Arguments go to train.py (e.g. --epochs 1); launch/run-node.sh does the rest and lists
# the environment overrides.
export NODE_RANK=1
export NODE_ADDR=127.0.0.1
exec bash "$(dirname "${BASH_SOURCE[0]}")/run-node.sh" "$@"
