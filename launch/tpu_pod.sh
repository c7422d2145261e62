#!/usr/bin/env bash
# Train on a Cloud TPU VM slice: every worker runs one rankjax process.
#
#   launch/tpu_pod.sh setup TPU ZONE                 copy this checkout to every worker, install
#   launch/tpu_pod.sh train TPU ZONE CONFIG WORKDIR [--set key=value ...]
#   launch/tpu_pod.sh reproduce TPU ZONE STUDY --scale paper --out gs://bucket/DIR
#   launch/tpu_pod.sh logs  TPU ZONE [WORKER]        tail a worker's log (default 0)
#   launch/tpu_pod.sh stop  TPU ZONE                 SIGTERM every worker (saves a checkpoint)
#
# WORKDIR must be storage every worker sees (gs://bucket/run: Orbax writes there
# directly); CONFIG is a path inside the checkout (experiments/configs/...).
# Each worker calls jax.distributed.initialize() (RANKJAX_DISTRIBUTED=1; the TPU
# runtime supplies the coordinator), reads its own shard of the data, and the
# checkpoint holds one data-iterator file per worker. Re-running `train` with the
# same WORKDIR resumes; so does a slice recreated after preemption (same size).
# Environment: PROJECT (default: gcloud's), RANKJAX_DIR (default ~/rankjax on the VMs),
# PYTHON (default python3 on the VMs). setup installs launch/requirements-tpu.txt (the
# pinned versions); train / reproduce set LIBTPU_INIT_ARGS from launch/xla_flags.sh.
# A study's settings in your environment reach every worker's train / reproduce:
# RANKJAX_FINEWEB (the softmax study's FineWeb: a directory every worker reads),
# RANKJAX_TINY_DATA_DIR, RANKJAX_FASHION_MNIST, RANKJAX_CACHE, TFDS_DATA_DIR.
set -euo pipefail

usage() { sed -n '2,23p' "$0"; exit 2; }
[[ $# -ge 3 ]] || usage
cmd=$1 tpu=$2 zone=$3
shift 3
project_flag=()
[[ -n "${PROJECT:-}" ]] && project_flag=(--project "$PROJECT")
remote_dir=${RANKJAX_DIR:-'~/rankjax'}
py=${PYTHON:-python3}
here=$(cd "$(dirname "$0")/.." && pwd)
# async collective fusion / overlap flags for libtpu (launch/xla_flags.sh; yours win)
source "$here/launch/xla_flags.sh"
libtpu_args=$(printf '%q' "${RANKJAX_TPU_LIBTPU_ARGS}${LIBTPU_INIT_ARGS:+ $LIBTPU_INIT_ARGS}")

# the study settings set here, as NAME=value words for the workers' command line
STUDY_SETTINGS=(RANKJAX_FINEWEB RANKJAX_TINY_DATA_DIR RANKJAX_FASHION_MNIST RANKJAX_CACHE
                TFDS_DATA_DIR)
settings=""
for name in "${STUDY_SETTINGS[@]}"; do
  if [[ -n "${!name:-}" ]]; then settings+="$name=$(printf '%q' "${!name}") "; fi
done

ssh_all() {
  gcloud compute tpus tpu-vm ssh "$tpu" --zone "$zone" "${project_flag[@]}" --worker=all \
    --command "$1"
}

case "$cmd" in
  setup)
    tar -C "$here" --exclude=.venv --exclude=.git --exclude='*.pyc' -czf /tmp/rankjax_src.tgz .
    gcloud compute tpus tpu-vm scp /tmp/rankjax_src.tgz "$tpu":/tmp/rankjax_src.tgz \
      --zone "$zone" "${project_flag[@]}" --worker=all
    ssh_all "mkdir -p $remote_dir && tar -xzf /tmp/rankjax_src.tgz -C $remote_dir && \
      $py -m pip install -q -r $remote_dir/launch/requirements-tpu.txt -e $remote_dir"
    ;;
  train)
    [[ $# -ge 2 ]] || usage
    config=$1 workdir=$2
    shift 2
    extra=""
    for a in "$@"; do extra+=" $(printf '%q' "$a")"; done
    # nohup + setsid: the run survives the ssh session; one log per worker.
    # the compilation cache next to the run: a restarted slice loads the compiled step
    ssh_all "cd $remote_dir && ${settings}RANKJAX_DISTRIBUTED=1 LIBTPU_INIT_ARGS=$libtpu_args \
      JAX_COMPILATION_CACHE_DIR=\${JAX_COMPILATION_CACHE_DIR:-$(printf '%q' "$workdir")/xla_cache} \
      setsid nohup $py -m rankjax train \
      --config $(printf '%q' "$config") --workdir $(printf '%q' "$workdir")$extra \
      > ~/rankjax_train.log 2>&1 < /dev/null & echo \$! > ~/rankjax_train.pid; \
      echo started on \$(hostname)"
    ;;
  reproduce)
    # a study's experiments on every worker: each trains the runs, worker 0 analyses and
    # writes the report (rankjax reproduce; OUT must be gs:// or storage all workers see)
    [[ $# -ge 1 ]] || usage
    extra=""
    for a in "$@"; do extra+=" $(printf '%q' "$a")"; done
    ssh_all "cd $remote_dir && ${settings}RANKJAX_DISTRIBUTED=1 LIBTPU_INIT_ARGS=$libtpu_args \
      setsid nohup $py -m rankjax reproduce$extra \
      > ~/rankjax_train.log 2>&1 < /dev/null & echo \$! > ~/rankjax_train.pid; \
      echo started on \$(hostname)"
    ;;
  logs)
    gcloud compute tpus tpu-vm ssh "$tpu" --zone "$zone" "${project_flag[@]}" \
      --worker="${1:-0}" --command "tail -n 50 -f ~/rankjax_train.log"
    ;;
  stop)
    ssh_all "kill -TERM \$(cat ~/rankjax_train.pid) 2>/dev/null || true"
    ;;
  *) usage ;;
esac
