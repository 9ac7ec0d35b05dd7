#!/usr/bin/env bash
echo "node 1 10.0.0.11"
