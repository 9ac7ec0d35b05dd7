#!/usr/bin/env bash
echo "node 0 fd00::1"
