#!/usr/bin/env bash
echo "node 0 192.168.1.10"
