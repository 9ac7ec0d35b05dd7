#!/usr/bin/env bash
echo "node 1 fd00::2"
