#!/usr/bin/env bash
echo "node 0 10.0.0.10"
