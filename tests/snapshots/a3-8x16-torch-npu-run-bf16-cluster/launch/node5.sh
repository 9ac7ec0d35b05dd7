#!/usr/bin/env bash
echo "node 5 10.0.0.15"
