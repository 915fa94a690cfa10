#!/usr/bin/env bash
# torchrun launch: Megatron-LM pretrain_gpt.py (core_v0.16.1 flags), rendered by configurator.
# model: llama3-8b: layers=32 hidden=4096 ffn=14336 heads=32 query_groups=8 seq=8192 vocab=128256
# plan: tp=1 pp=1 dp=32 cp=1 vp=1 mbs=1 gbs=256 ep=1 etp=1 first=0 last=0 acct_emb=False
#       acct_loss=False recompute=none recompute_modules=core_attn sequence_parallel=False
#       distributed_optimizer=True precision=fp8 cp_comm_type=p2p attention_backend=auto
#       masked_softmax_fusion=True attention_softmax_in_fp32=False overlap_grad_reduce=True
#       overlap_param_gather=True fp8_param_gather=True grad_reduce_in_bf16=True
#       cross_entropy_fusion=te megatron_fsdp=False tp_comm_overlap=True a2a_overlap=False
#       use_precision_aware_optimizer=True exp_avg_dtype=bf16 exp_avg_sq_dtype=bf16
#       microbatches=8
# cluster: nodes=4 gpus_per_node=8 world_size=32
# predicted:
#   iteration_time_s: 5.084
#   model_tflops_per_gpu: 663.5
#   mfu: 0.671
#   peak_memory_GiB: 70.24
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
    echo "error: a 4-node run needs MASTER_ADDR, the address of node_rank 0 that every node reaches (this script has no host placement to take it from); it is not set" >&2
    exit 2
fi
case "${MASTER_ADDR,,}" in
    localhost|localhost.*|127.*|::1|\[::1\]|0:0:0:0:0:0:0:1|0.0.0.0)
        echo "error: a 4-node run needs MASTER_ADDR, the address of node_rank 0 that every node reaches, not $MASTER_ADDR (this machine only)" >&2
        exit 2 ;;
esac
MASTER_PORT=${MASTER_PORT:-29500}

NODE_RANK="${NODE_RANK:-}"
if [[ $# -gt 0 && "$1" != -* ]]; then
    NODE_RANK="$1"
    shift
fi
if [[ -z "$NODE_RANK" ]]; then
    echo "error: pass the node rank (0..3) as the first argument or set NODE_RANK" >&2
    exit 2
fi
if ! [[ "$NODE_RANK" =~ ^[0-9]+$ ]] || (( 10#$NODE_RANK >= 4 )); then
    echo "error: node rank must be an integer in 0..3, got \"$NODE_RANK\"" >&2
    exit 2
fi
NODE_RANK=$(( 10#$NODE_RANK ))

TORCHRUN_ARGS=(
    --nnodes 4
    --nproc-per-node 8
    --node-rank "$NODE_RANK"
    --master-addr "$MASTER_ADDR"
    --master-port "$MASTER_PORT"
)

# shellcheck disable=SC2054  # commas belong to values (--split 949,50,1)
MEGATRON_ARGS=(
    # parallelism
    --tensor-model-parallel-size 1
    --pipeline-model-parallel-size 1
    --context-parallel-size 1
    --use-distributed-optimizer
    --overlap-grad-reduce
    --overlap-param-gather
    # batch
    --micro-batch-size 1
    --global-batch-size 256
    # model
    --num-layers 32
    --hidden-size 4096
    --ffn-hidden-size 14336
    --num-attention-heads 32
    --group-query-attention
    --num-query-groups 8
    --seq-length 8192
    --max-position-embeddings 8192
    --position-embedding-type rope
    --normalization RMSNorm
    --swiglu
    --untie-embeddings-and-output-weights
    --disable-bias-linear
    --hidden-dropout 0.0
    --attention-dropout 0.0
    --rotary-base 500000
    # precision and kernels
    --bf16
    --fp8-format hybrid
    --attention-backend auto
    --fp8-param-gather
    --grad-reduce-in-bf16
    --cross-entropy-loss-fusion
    --cross-entropy-fusion-impl te
    --use-precision-aware-optimizer
    --exp-avg-dtype bf16
    --exp-avg-sq-dtype bf16
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
    --vocab-size 128255
)

exec torchrun "${TORCHRUN_ARGS[@]}" "$MEGATRON_LM_DIR/pretrain_gpt.py" "${MEGATRON_ARGS[@]}" "$@"
