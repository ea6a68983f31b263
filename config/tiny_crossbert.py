# The default run, spelled out: a tiny CrossBERT on the built-in corpus, about 7 minutes on 2 CPU cores (bf16,
# compact vocabulary of 8,192 ids, 3,825 steps of 3,072 tokens = 1.2e14 FLOPs: see experiments/LOG.md).
model_type = "crossbert"
n_layer = 2
n_head = 2
n_embd = 128
block_size = 128
dataset = "tinybooks"
out_dir = "out"
