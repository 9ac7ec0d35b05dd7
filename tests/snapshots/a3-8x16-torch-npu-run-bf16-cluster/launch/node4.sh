#!/usr/bin/env bash
echo "node 4 10.0.0.14"
