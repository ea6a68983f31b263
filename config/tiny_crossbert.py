# The default run, spelled out: a tiny CrossBERT on the built-in corpus, a few minutes on 2 CPU cores.
model_type = "crossbert"
n_layer = 4
n_head = 4
n_embd = 128
block_size = 128
dataset = "tinybooks"
out_dir = "out"
