# The XLA options both launchers set (sourced by slurm.sbatch and tpu_pod.sh).
#
# GPU (XLA_FLAGS): the latency-hiding scheduler, so the FSDP all-gathers of the next
# layer's weights and the reduce-scatters of the last layer's gradients overlap the
# current layer's matmuls; collectives on the highest-priority stream; all-gather,
# reduce-scatter and all-reduce pipelined across the layer scan's iterations, with the
# scan double-buffered so the pipelined collective has an iteration to hide in. These
# are the FSDP flags of NVIDIA JAX-Toolbox's GPU performance guide and MaxText's GPU
# recipes. tests/test_launch.py checks that the pinned jaxlib (requirements-gpu.txt)
# parses every one of them: XLA aborts at start-up on an unknown flag.
#
# TPU (LIBTPU_INIT_ARGS): the async collective fusion and compute/collective overlap
# flags of MaxText's TPU recipes (v4 / v5e / v5p). libtpu alone parses them; nothing
# on a CPU can check them.
#
# Yours win: a flag you set in XLA_FLAGS / LIBTPU_INIT_ARGS comes after these (XLA
# takes the last occurrence). RANKJAX_XLA_FLAGS=0 sets none of them.

RANKJAX_GPU_XLA_FLAGS="--xla_gpu_enable_latency_hiding_scheduler=true \
--xla_gpu_enable_highest_priority_async_stream=true \
--xla_gpu_enable_pipelined_all_gather=true \
--xla_gpu_enable_pipelined_reduce_scatter=true \
--xla_gpu_enable_pipelined_all_reduce=true \
--xla_gpu_enable_while_loop_double_buffering=true"

RANKJAX_TPU_LIBTPU_ARGS="--xla_tpu_enable_data_parallel_all_reduce_opt=true \
--xla_tpu_data_parallel_opt_different_sized_ops=true \
--xla_tpu_enable_async_collective_fusion=true \
--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true \
--xla_tpu_enable_async_collective_fusion_multiple_steps=true \
--xla_tpu_overlap_compute_collective_tc=true \
--xla_enable_async_all_gather=true"

if [[ "${RANKJAX_XLA_FLAGS:-1}" == "0" ]]; then
  RANKJAX_GPU_XLA_FLAGS="" RANKJAX_TPU_LIBTPU_ARGS=""
fi
