#!/usr/bin/env bash
echo "node 7 10.0.0.17"
