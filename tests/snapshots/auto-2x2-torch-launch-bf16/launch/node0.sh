#!/usr/bin/env bash
echo "node 0 127.0.0.1"
