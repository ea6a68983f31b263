# ELECTRA (discriminator) at BERT-base size on DCLM, for one 8-GPU node:
#   python data/dclm/prepare.py --max_tokens=3000000000
#   torchrun --standalone --nproc_per_node=8 train.py config/base_electra_dclm.py
# Our choice of budget: ~20 tokens per parameter as in the paper's sweep (~2.5B tokens for ~125M params),
# the same steps as the BERT and CrossBERT base configs.
model_type = "electra"
gen_width = 0.25                # generator 192 wide (3 heads of 64), 12 blocks, as the CPU recipe and sweep.py
                                # (ELECTRA-base used 1/3); a step costs 6% more FLOPs than BERT-base's (flops.py)
n_layer = 12
n_head = 12
n_embd = 768
block_size = 512
vocab_size = 0                  # GPT-2's full vocabulary (the compact one is for head-bound CPU runs)
dataset = "dclm"
batch_size = 64                 # rows per GPU per micro-step
total_batch_size = 512 * 512    # 262k tokens per step
max_iters = 10_000              # 2.6B tokens
warmup_iters = 500
learning_rate = 1e-3
min_lr = 1e-4
beta2 = 0.98
weight_decay = 0.1
eval_interval = 1000
eval_iters = 50
log_interval = 50
out_dir = "out-base-electra"
