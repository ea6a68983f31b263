# The BERT twin of the default run: same encoder, data and training FLOPs (1.2e14: 9,607 steps, since a BERT step
# costs less); 20% masking with BERT's 80/10/10, no CMS.
model_type = "bert"
n_layer = 2
n_head = 2
n_embd = 128
block_size = 128
max_flops = 1.21e14
dataset = "tinybooks"
out_dir = "out-bert"
