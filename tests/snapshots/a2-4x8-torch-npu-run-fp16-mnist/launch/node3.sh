#!/usr/bin/env bash
echo "node 3 10.0.0.13"
