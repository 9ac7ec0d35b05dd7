#!/usr/bin/env bash
# a2-fsdp2: launch script for node 1 of 2 (host IP 10.0.0.11), ranks 8-15 of 16.
# Start every node's script at about the same time (README.md says which runs where).
# Arguments go to train.py (e.g. --epochs 1); launch/run-node.sh does the rest and lists
# the environment overrides.
export NODE_RANK=1
export NODE_ADDR=10.0.0.11
exec bash "$(dirname "${BASH_SOURCE[0]}")/run-node.sh" "$@"
