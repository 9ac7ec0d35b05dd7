#!/usr/bin/env bash
echo "node 1 127.0.0.1"
