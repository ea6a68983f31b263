# The default run, spelled out: a tiny CrossBERT on the built-in corpus, under 10 minutes on 2 CPU cores
# (bf16, compact vocabulary of 8,192 ids, 1,500 steps of 2,048 tokens: see docs/cpu-recipe.md).
model_type = "crossbert"
n_layer = 4
n_head = 4
n_embd = 128
block_size = 128
dataset = "tinybooks"
out_dir = "out"
