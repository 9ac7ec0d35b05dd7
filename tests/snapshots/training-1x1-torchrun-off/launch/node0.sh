#!/usr/bin/env bash
echo "node 0 192.168.0.5"
