#!/usr/bin/env bash
# status.sh JOBID: running | success | failed, as the cluster-generic executor expects.
rc_file=.snakemake/cluster-generic/$1.rc
if [[ -f $rc_file ]]; then
    [[ $(cat "$rc_file") == 0 ]] && echo success || echo failed
elif kill -0 "$1" 2> /dev/null; then
    echo running
else
    echo failed
fi
