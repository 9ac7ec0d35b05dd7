#!/usr/bin/env bash
echo "node 2 10.0.0.12"
