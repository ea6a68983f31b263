# ELECTRA (discriminator) at BERT-base size on DCLM, for one 8-GPU node:
#   python data/dclm/prepare.py --max_tokens=3000000000
#   torchrun --standalone --nproc_per_node=8 train.py config/base_electra_dclm.py
from config.base_dclm import *  # noqa: F401,F403  (the shape, data, batch and schedule the three base runs share)
model_type = "electra"
gen_width = 0.25                # generator 192 wide (3 heads of 64), 12 blocks, as the CPU recipe and sweep.py
                                # (ELECTRA-base used 1/3); a step costs 6% more FLOPs than BERT-base's (flops.py)
out_dir = "out-base-electra"
