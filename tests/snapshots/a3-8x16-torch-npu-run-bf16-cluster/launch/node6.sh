#!/usr/bin/env bash
# a3-big: launch script for node 6 of 8 (host IP 10.0.0.16), ranks 96-111 of 128.
# Start every node's script at about the same time (README.md says which runs where).
# Arguments go to train.py (e.g. --epochs 1); launch/run-node.sh does the rest and lists
# the environment overrides.
export NODE_RANK=6
export NODE_ADDR=10.0.0.16
exec bash "$(dirname "${BASH_SOURCE[0]}")/run-node.sh" "$@"
