#!/usr/bin/env bash
# torchrun launch: Megatron-LM pretrain_gpt.py (core_v0.16.1 flags), rendered by configurator.
# model: gpt-18.4b: layers=40 hidden=6144 ffn=24576 heads=48 query_groups=48 seq=2048 vocab=51200
# plan: tp=2 pp=1 dp=128 cp=1 vp=1 mbs=8 gbs=1024 ep=1 etp=1 first=0 last=0 acct_emb=False
#       acct_loss=False recompute=full recompute_modules=core_attn sequence_parallel=True
#       distributed_optimizer=True precision=fp16 cp_comm_type=p2p attention_backend=local
#       masked_softmax_fusion=True attention_softmax_in_fp32=False overlap_grad_reduce=True
#       overlap_param_gather=True grad_reduce_in_bf16=False cross_entropy_fusion=none
#       megatron_fsdp=False tp_comm_overlap=False a2a_overlap=False microbatches=1
# cluster: nodes=32 gpus_per_node=8 world_size=256
# predicted:
#   iteration_time_s: 6.921
#   model_tflops_per_gpu: 134.5
#   mfu: 0.431
#   peak_memory_GiB: 47.15
#
# Usage on every node: MEGATRON_LM_DIR=/path/to/Megatron-LM bash launch_torchrun.sh [NODE_RANK] [extra pretrain_gpt.py flags...]
# NODE_RANK: first argument, else $NODE_RANK (required).
# Environment: MASTER_ADDR (required: node_rank 0's address), MASTER_PORT
set -euo pipefail

export CUDA_DEVICE_MAX_CONNECTIONS=1
export CUDA_DEVICE_ORDER=PCI_BUS_ID

if [[ -z "${MEGATRON_LM_DIR:-}" ]]; then
    echo "error: MEGATRON_LM_DIR is not set; point it at a Megatron-LM checkout (core_v0.16.1)" >&2
    exit 2
fi
if [[ ! -f "$MEGATRON_LM_DIR/pretrain_gpt.py" ]]; then
    echo "error: $MEGATRON_LM_DIR/pretrain_gpt.py not found; MEGATRON_LM_DIR must be a Megatron-LM checkout" >&2
    exit 2
fi

MASTER_ADDR="${MASTER_ADDR:-}"
if [[ -z "$MASTER_ADDR" ]]; then
    echo "error: a 32-node run needs MASTER_ADDR, the address of node_rank 0 that every node reaches (this script has no host placement to take it from); it is not set" >&2
    exit 2
fi
case "${MASTER_ADDR,,}" in
    localhost|localhost.*|127.*|::1|\[::1\]|0:0:0:0:0:0:0:1|0.0.0.0)
        echo "error: a 32-node run needs MASTER_ADDR, the address of node_rank 0 that every node reaches, not $MASTER_ADDR (this machine only)" >&2
        exit 2 ;;
esac
MASTER_PORT=${MASTER_PORT:-29500}

NODE_RANK="${NODE_RANK:-}"
if [[ $# -gt 0 && "$1" != -* ]]; then
    NODE_RANK="$1"
    shift
fi
if [[ -z "$NODE_RANK" ]]; then
    echo "error: pass the node rank (0..31) as the first argument or set NODE_RANK" >&2
    exit 2
fi
if ! [[ "$NODE_RANK" =~ ^[0-9]+$ ]] || (( 10#$NODE_RANK >= 32 )); then
    echo "error: node rank must be an integer in 0..31, got \"$NODE_RANK\"" >&2
    exit 2
fi
NODE_RANK=$(( 10#$NODE_RANK ))

TORCHRUN_ARGS=(
    --nnodes 32
    --nproc-per-node 8
    --node-rank "$NODE_RANK"
    --master-addr "$MASTER_ADDR"
    --master-port "$MASTER_PORT"
)

# shellcheck disable=SC2054  # commas belong to values (--split 949,50,1)
MEGATRON_ARGS=(
    # parallelism
    --tensor-model-parallel-size 2
    --pipeline-model-parallel-size 1
    --context-parallel-size 1
    --sequence-parallel
    --use-distributed-optimizer
    --overlap-grad-reduce
    --overlap-param-gather
    # recompute
    --recompute-granularity full
    --recompute-method uniform
    --recompute-num-layers 1
    # batch
    --micro-batch-size 8
    --global-batch-size 1024
    # model
    --num-layers 40
    --hidden-size 6144
    --ffn-hidden-size 24576
    --num-attention-heads 48
    --seq-length 2048
    --max-position-embeddings 2048
    --position-embedding-type learned_absolute
    --normalization LayerNorm
    --hidden-dropout 0.1
    --attention-dropout 0.1
    # precision and kernels
    --fp16
    --transformer-impl local
    # training
    --train-iters 100
    --lr 0.0003
    --min-lr 3e-05
    --lr-decay-style cosine
    --lr-warmup-iters 10
    --weight-decay 0.1
    --adam-beta2 0.95
    --clip-grad 1.0
    --log-interval 1
    --eval-iters 0
    --eval-interval 1000
    --seed 1234
    # data
    --mock-data
    --tokenizer-type NullTokenizer
    --vocab-size 51199
)

exec torchrun "${TORCHRUN_ARGS[@]}" "$MEGATRON_LM_DIR/pretrain_gpt.py" "${MEGATRON_ARGS[@]}" "$@"
