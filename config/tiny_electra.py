# The ELECTRA twin of the default run: same discriminator, data and steps; 15% masking, a generator
# a quarter as wide, loss = generator MLM + 50 x replaced-token detection.
model_type = "electra"
n_layer = 4
n_head = 4
n_embd = 128
block_size = 128
gen_width = 0.25
dataset = "tinybooks"
out_dir = "out-electra"
