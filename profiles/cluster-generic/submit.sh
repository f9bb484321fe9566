#!/usr/bin/env bash
# submit.sh JOBSCRIPT: run the job script detached on this machine; print its job id (the pid). The
# exit status goes to .snakemake/cluster-generic/<pid>.rc for status.sh.
set -euo pipefail
mkdir -p .snakemake/cluster-generic
script=$1
nohup bash -c "bash '$script' > .snakemake/cluster-generic/\$\$.log 2>&1; echo \$? > .snakemake/cluster-generic/\$\$.rc" \
    > /dev/null 2>&1 &
echo $!
