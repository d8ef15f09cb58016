"""Real torchrun command lines, as their projects publish them, for the compatibility test.

Each line is copied as written in its source (backslash continuations joined); the shell
variables it uses get the values given (for one CPU host), and the shell expands the line as
it would. docs/torchrun.md shows the same table.
"""

# ruff: noqa: E501  (each line is kept as its project wrote it)

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Line:
    source: str
    line: str
    variables: dict[str, str] = field(default_factory=dict)


GPUS = {"NGPU": "2", "LOG_RANK": "0"}

LINES = [
    Line("karpathy/nanoGPT:README.md",
         "torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2.py"),
    Line("pytorch/examples:distributed/ddp-tutorial-series/run_example.sh",
         'torchrun --nnodes=1 --nproc_per_node=${2:-2} --rdzv_id=101 --rdzv_endpoint="localhost:5972" ${1:-example.py}'),
    Line("pytorch/examples:distributed/tensor_parallelism/run_tensor_parallel.sh",
         'torchrun --nnodes=1 --nproc_per_node=4 --rdzv_id=101 --rdzv_endpoint="localhost:5973" tensor_parallel_example.py'),
    Line("pytorch/examples:distributed/FSDP2/README.md", "torchrun --nproc_per_node 2 train.py"),
    Line("pytorch/examples:distributed/FSDP2/run_example.sh",
         "torchrun --nnodes=1 --nproc_per_node=${2:-4} ${1:-example.py}"),
    Line("pytorch/tutorials:beginner_source/ddp_series_fault_tolerance.rst",
         "torchrun --standalone --nproc_per_node=4 multigpu_torchrun.py 50 10"),
    Line("pytorch/torchtitan:run_train.sh",
         'PYTORCH_ALLOC_CONF="expandable_segments:True" TORCHFT_LIGHTHOUSE=${TORCHFT_LIGHTHOUSE} torchrun --nproc_per_node=${NGPU} --rdzv_backend c10d --rdzv_endpoint="localhost:0" --local-ranks-filter ${LOG_RANK} --role rank --tee 3 -m torchtitan.train --module ${MODULE} --config ${CONFIG} "$@"',
         {**GPUS, "TORCHFT_LIGHTHOUSE": "", "MODULE": "llama3", "CONFIG": "llama3_debugmodel"}),
    Line("pytorch/torchtitan:scripts/generate/run_llama_generate.sh",
         'torchrun --standalone --nproc_per_node="${NGPU}" --local-ranks-filter="${LOG_RANK}" -m scripts.generate.test_generate --config="${CONFIG_FILE}" --checkpoint="${CHECKPOINT_DIR}" --prompt="${PROMPT}" "${overrides[@]}"',
         {**GPUS, "CONFIG_FILE": "./debug_model.toml", "CHECKPOINT_DIR": "./outputs/checkpoint/",
          "PROMPT": "Hello there"}),
    Line("pytorch/torchtitan:torchtitan/experiments/deepseek_v3/run_training.sh",
         "torchrun --standalone  --local-ranks-filter ${LOG_RANK} --nproc-per-node ${NGPU} train.py", GPUS),
    Line("pytorch/torchchat:run_dist.sh",
         "torchrun --nproc-per-node=$NGPU --master_port=$PORT --local-ranks-filter ${LOG_RANK} --role rank --tee 3 dist_run.py",
         {**GPUS, "PORT": "29613"}),
    Line("karpathy/nanochat:speedrun.sh",
         "torchrun --standalone --nproc_per_node=$NPROC_PER_NODE -m scripts.base_train -- --depth=20 --target-param-data-ratio=20 --run=$WANDB_RUN",
         {"NPROC_PER_NODE": "2", "WANDB_RUN": "dummy"}),
    Line("karpathy/nanochat:speedrun.sh (chat_eval)",
         "torchrun --standalone --nproc_per_node=$NPROC_PER_NODE -m scripts.chat_eval -- -i sft",
         {"NPROC_PER_NODE": "2"}),
    Line("meta-llama/llama:README.md",
         "torchrun --nproc_per_node 1 example_chat_completion.py --ckpt_dir llama-2-7b-chat/ --tokenizer_path tokenizer.model --max_seq_len 512 --max_batch_size 6"),
    Line("fla-org/flame:train.sh",
         'PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True" torchrun --nnodes=${NNODE} --nproc_per_node=${NGPU} --rdzv_backend c10d --rdzv_endpoint "${MASTER_ADDR}:${MASTER_PORT}" --local-ranks-filter ${LOG_RANK} --role rank --tee 3 train.py $params',
         {**GPUS, "NNODE": "1", "MASTER_ADDR": "localhost", "MASTER_PORT": "0", "params": "--lr 3e-4"}),
    Line("huggingface/accelerate:examples/README.md",
         "torchrun --nproc_per_node 2 ./cv_example.py --data_dir path_to_data"),
    Line("StrongResearch/isc-demos:tiny_training/run.sh",
         "torchrun --nnodes=1 --nproc_per_node=1 --rdzv_id=100 --rdzv_backend=c10d --rdzv_endpoint=$MASTER_ADDR:$MASTER_PORT train.py $@",
         {"MASTER_ADDR": "localhost", "MASTER_PORT": "12356"}),
    Line("KellerJordan/modded-nanogpt:run.sh",
         "torchrun --standalone --nproc_per_node=1 train_gpt.py"),
]  # fmt: skip
