#!/usr/bin/env bash
# Puts pytest's temporary folders (every test's tmp_path) in RAM where it can: `make test` and `make test-fast`
# run this first.
#
# The suite writes some hundred thousand small files (a render alone writes about 80: its project, its copy of
# runtime/, its journal) and removes most of them again. On this machine kind's ext4 disk the kernel's work for
# them was a sixth of the CPU time of `make test-fast`: with the files in a tmpfs, the same run took 59 s of
# system time instead of 98 and ended 17 s sooner (benchmarks/suite_costs.py recordings, fast14 against fast11).
#
# As root, it mounts a tmpfs (at most half the memory, tmpfs's default) at pytest's base folder for this user,
# $TMPDIR/pytest-of-USER (/tmp/pytest-of-root), where pytest makes its numbered run folders: every path a test
# sees stays exactly as long as before (the Slurm tests' sockets live under a tmp_path, and a socket path may be
# at most 107 characters). The mount stays, like /tmp; a passing test's folder goes when the test ends
# (pyproject.toml: tmp_path_retention_policy), a failing one's stays to read, and `umount` gives the memory back.
# It does nothing where that folder is on a tmpfs already (a tmpfs /tmp, or an earlier run's mount), where it is
# not root, or where the folder is a link or someone else's (pytest refuses such a folder itself).
set -euo pipefail

base=${TMPDIR:-/tmp}
folder=${base%/}/pytest-of-$(id -un)

[[ -d $base ]] || exit 0
if [[ -L $folder || $(stat -f -c %T "$base") == tmpfs ]]; then
    exit 0
elif [[ -d $folder ]]; then
    [[ $(stat -c %u "$folder") == "$EUID" && $(stat -f -c %T "$folder") != tmpfs ]] || exit 0
elif [[ -e $folder ]]; then
    exit 0
fi
[[ $EUID -eq 0 ]] && command -v mount >/dev/null || exit 0
[[ -d $folder ]] || mkdir -m 700 "$folder" || exit 0
# the earlier runs' folders (failed tests' files) are hidden under the mount until it goes, not removed
mount -t tmpfs -o mode=700,size=50% npu-wizard-tests "$folder" 2>/dev/null || true
