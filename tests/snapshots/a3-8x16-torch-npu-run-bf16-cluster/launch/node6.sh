#!/usr/bin/env bash
echo "node 6 10.0.0.16"
