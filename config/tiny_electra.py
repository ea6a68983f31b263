# The ELECTRA twin of the default run: same discriminator, data and training FLOPs (1.2e14: 8,620 steps); 15%
# masking, a generator a quarter as wide, loss = generator MLM + 50 x replaced-token detection.
model_type = "electra"
n_layer = 2
n_head = 2
n_embd = 128
block_size = 128
gen_width = 0.25
max_flops = 1.21e14
dataset = "tinybooks"
out_dir = "out-electra"
