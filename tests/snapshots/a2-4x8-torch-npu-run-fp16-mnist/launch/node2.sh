#!/usr/bin/env bash
# a2-mnist: launch script for node 2 of 4 (host IP 10.0.0.12), ranks 16-23 of 32.
# Start every node's script at about the same time (README.md says which runs where).
# Arguments go to train.py (e.g. --epochs 1); launch/run-node.sh does the rest and lists
# the environment overrides.
export NODE_RANK=2
export NODE_ADDR=10.0.0.12
exec bash "$(dirname "${BASH_SOURCE[0]}")/run-node.sh" "$@"
