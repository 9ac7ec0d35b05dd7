#!/usr/bin/env bash
echo "node 0 10.1.0.1"
