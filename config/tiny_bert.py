# The BERT twin of the default run: same encoder, data and budget; 20% masking, no CMS.
model_type = "bert"
n_layer = 4
n_head = 4
n_embd = 128
block_size = 128
dataset = "tinybooks"
out_dir = "out-bert"
