#!/usr/bin/env bash
# torchrun launch: Megatron-LM pretrain_gpt.py (core_v0.16.1 flags), rendered by configurator.
# model: custom-gpt-13b: layers=40 hidden=5120 ffn=20480 heads=40 query_groups=40 seq=2048 vocab=50257
# plan: tp=2 pp=1 dp=16 cp=1 vp=1 mbs=4 gbs=256 ep=1 etp=1 first=0 last=0 acct_emb=False
#       acct_loss=False recompute=none recompute_modules=core_attn sequence_parallel=True
#       distributed_optimizer=True precision=bf16 cp_comm_type=p2p attention_backend=auto
#       masked_softmax_fusion=True attention_softmax_in_fp32=False overlap_grad_reduce=True
#       overlap_param_gather=True grad_reduce_in_bf16=True cross_entropy_fusion=te
#       megatron_fsdp=False tp_comm_overlap=False a2a_overlap=False
#       use_precision_aware_optimizer=True exp_avg_dtype=bf16 exp_avg_sq_dtype=bf16
#       microbatches=4
# cluster: nodes=4 gpus_per_node=8 world_size=32
# predicted:
#   iteration_time_s: 2.328
#   model_tflops_per_gpu: 559.8
#   mfu: 0.566
#   peak_memory_GiB: 58.41
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
    --tensor-model-parallel-size 2
    --pipeline-model-parallel-size 1
    --context-parallel-size 1
    --sequence-parallel
    --use-distributed-optimizer
    --overlap-grad-reduce
    --overlap-param-gather
    # batch
    --micro-batch-size 4
    --global-batch-size 256
    # model
    --num-layers 40
    --hidden-size 5120
    --ffn-hidden-size 20480
    --num-attention-heads 40
    --seq-length 2048
    --max-position-embeddings 2048
    --position-embedding-type learned_absolute
    --normalization LayerNorm
    --hidden-dropout 0.1
    --attention-dropout 0.1
    # precision and kernels
    --bf16
    --attention-backend auto
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
    --vocab-size 50256
)

exec torchrun "${TORCHRUN_ARGS[@]}" "$MEGATRON_LM_DIR/pretrain_gpt.py" "${MEGATRON_ARGS[@]}" "$@"
