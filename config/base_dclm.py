# What the BERT-base-sized runs on DCLM share (config/base_{bert,crossbert,electra}_dclm.py import it).
# Our choice of budget: ~20 tokens per parameter as in the paper's sweep (~2.5B tokens for ~125M params).
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
