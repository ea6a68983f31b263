# BERT at BERT-base size on DCLM, for one 8-GPU node:
#   python data/dclm/prepare.py --max_tokens=3000000000
#   torchrun --standalone --nproc_per_node=8 train.py config/base_bert_dclm.py
from config.base_dclm import *  # noqa: F401,F403  (the shape, data, batch and schedule the three base runs share)
model_type = "bert"
out_dir = "out-base-bert"
