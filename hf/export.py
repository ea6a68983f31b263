"""
Export a trained encoder to a folder the HF ecosystem loads: transformers' AutoModel, and sentence-transformers.

    python hf/export.py --ckpt=out/ckpt.pt --out=exported/my-encoder                       # the encoder alone
    python hf/export.py --ckpt=out/ckpt.pt --pooler=pooler.pt --out=exported/my-embedder   # with embed.py's pooler

    from transformers import AutoModel, AutoTokenizer
    model = AutoModel.from_pretrained("exported/my-encoder", trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained("exported/my-encoder")
    out = model(**tokenizer(["a text", "another"], padding=True, truncation=True, return_tensors="pt"))
    out.last_hidden_state, out.pooler_output    # model.encode()'s states; embed.py's unit-norm embedding

    from sentence_transformers import SentenceTransformer
    SentenceTransformer("exported/my-embedder", trust_remote_code=True).encode(["a text"])  # = embed.py --texts

The folder holds:
  model.safetensors      the encoder's weights only (and the pooler's): no optimizer, no LM head, predictor or generator
  config.json            the encoder's ModelConfig, the pooler's kind, and the family that trained it
  modeling_crossbert.py  the AutoModel class (beside this script), with copies of model.py and masking.py:
                         the exported model runs the code it was trained with, not a second implementation
  vocab.json, merges.txt, tokenizer_config.json   GPT-2's BPE, written from data/gpt2.tiktoken (the compact
                         vocabulary's map is inside the model, as in training)
  modules.json, ...      sentence-transformers' files, when it (6.0 or later) is installed

Needs safetensors (transformers brings it); loading needs transformers. A missing extra is named with its pip command.
The folder is built beside --out and renamed into place at the end: a failed export leaves nothing behind.
"""
import json
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)  # the project's modules, when run as `python hf/export.py`
from checkpoint import load_checkpoint
from configurator import configure
from data.tokenizer import EOT, MASK, PAD, load_ranks
from errors import UserError, check_writable, optional, user_errors
from features import load_pooler

settings = dict(
    ckpt="out/ckpt.pt",     # a train.py checkpoint
    pooler="",              # an embed.py --save_pooler file trained on --ckpt ("" = mean pooling)
    out="",                 # the folder to write (needed); it must not exist yet
)

ENCODER_KEYS = ("wte.", "ln_e.", "blocks.", "ln_f.", "vocab_map")  # model.py's shared stack: every family's encoder
CODE = ("model.py", "masking.py")  # what modeling_crossbert.py runs


def encoder_state(model):
    """The encoder's tensors of a trained model of any family, under the names the exported model gives them."""
    return {f"encoder.{k}": v.detach().cpu().contiguous() for k, v in model.state_dict().items()
            if k.startswith(ENCODER_KEYS)}


def encoder_config(config):
    """The ModelConfig fields of the exported encoder: the trained shape, as a BERT without the LM head (whose
    encode() is the same stack, so every family exports alike); the masking settings are training's, not kept."""
    args = {k: v for k, v in vars(config).items() if k not in ("mask_ratio", "cms", "pred_layer", "gen_layer",
                                                                  "random_replace")}
    return dict(args, model_type="bert", lm_head=False, decoder_bias=False)


def byte_stand_ins():
    """GPT-2's table of printable stand-ins for the 256 bytes, as HF's byte-level BPE files spell tokens: printable
    Latin-1 bytes stand for themselves, the others take the code points from 256 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    table = {b: chr(b) for b in printable}
    table.update({b: chr(256 + i) for i, b in enumerate(others)})
    return table


def bpe_files(ranks):
    """(vocab, merges) of HF's vocab.json and merges.txt from tiktoken's ranks {token bytes: id}. A token's merge is
    the last step of encoding its bytes with the merges ranked below it: always two tokens of lower rank."""
    show = byte_stand_ins()
    spell = lambda tok: "".join(show[b] for b in tok)  # noqa: E731
    merges = []
    for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        parts = [bytes([b]) for b in tok]
        while len(parts) > 2:
            pair_ranks = [ranks.get(a + b, rank) for a, b in zip(parts, parts[1:])]
            i = min(range(len(pair_ranks)), key=pair_ranks.__getitem__)
            if pair_ranks[i] >= rank:
                raise ValueError(f"the BPE ranks cannot build token {rank} from lower ranks: a corrupted ranks file")
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        if len(parts) == 2:
            merges.append(f"{spell(parts[0])} {spell(parts[1])}")
    vocab = {spell(tok): rank for tok, rank in ranks.items()}
    vocab.update({"<|endoftext|>": EOT, "<mask>": MASK, "<pad>": PAD})
    return vocab, merges


def write_tokenizer(folder, block_size):
    vocab, merges = bpe_files(load_ranks())
    with open(os.path.join(folder, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(folder, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "\n".join(merges) + "\n")
    special = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
               "pad_token": "<pad>", "mask_token": "<mask>"}
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        # as data/tokenizer.py encodes: no BOS or EOS added, special tokens' spellings in a text are plain text;
        # texts are cut at block_size tokens, as features.tokenize() does
        json.dump(dict(tokenizer_class="GPT2Tokenizer", model_max_length=block_size, add_prefix_space=False,
                       add_bos_token=False, split_special_tokens=True, padding_side="right", **special), f, indent=2)


def write_model(folder, model, ckpt_info, pooler, saved):
    from safetensors.torch import save_file  # export() checked that safetensors is installed
    tensors = encoder_state(model)
    if pooler is not None:
        tensors.update({f"pooler.{k}": v.detach().cpu().contiguous() for k, v in pooler.state_dict().items()})
    save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    cfg = model.config
    config = dict(
        architectures=["CrossBERTEncoderModel"], model_type="crossbert_encoder",
        auto_map={"AutoConfig": "modeling_crossbert.CrossBERTEncoderConfig",
                  "AutoModel": "modeling_crossbert.CrossBERTEncoderModel"},
        encoder=encoder_config(cfg),
        pooler=None if saved is None else {k: saved[k] for k in ("kind", "n_embd", "n_head")},
        trained_as=cfg.model_type, hidden_size=cfg.n_embd, num_hidden_layers=cfg.n_layer,
        num_attention_heads=cfg.n_head, max_position_embeddings=cfg.block_size, vocab_size=cfg.token_ids,
        pad_token_id=PAD, torch_dtype="float32", trained=ckpt_info)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    shutil.copy(os.path.join(HERE, "modeling_crossbert.py"), folder)
    for name in CODE:
        with open(os.path.join(ROOT, name)) as f:
            code = f.read()
        # the copies are one package with the modeling file, which transformers imports by relative imports
        relative = code.replace("\nfrom masking import ", "\nfrom .masking import ")
        if name == "model.py" and relative == code:
            raise RuntimeError("model.py no longer imports `from masking import`: update export.py's rewrite")
        with open(os.path.join(folder, name), "w") as f:
            f.write(relative)


def write_sentence_transformers(folder, block_size):
    """sentence-transformers' files in the same folder: one module, the exported model, whose pooler_output is the
    sentence embedding. Skipped, with a line saying so, when sentence-transformers (6.0 or later) is not installed:
    the folder still loads in transformers."""
    try:  # the module of 6.0 on, whose Transformer takes modality_config
        modules = optional("sentence_transformers.sentence_transformer.modules", "loading the export in "
                           "sentence-transformers")
    except UserError as e:
        print(f"{e}; then export again (the folder loads in transformers only)", file=sys.stderr)
        return False
    from sentence_transformers import SentenceTransformer
    module = modules.Transformer(
        folder, max_seq_length=block_size, model_kwargs={"trust_remote_code": True},
        config_kwargs={"trust_remote_code": True}, processor_kwargs={"trust_remote_code": True},
        modality_config={"text": {"method": "forward", "method_output_name": "pooler_output"}},
        module_output_name="sentence_embedding")
    SentenceTransformer(modules=[module]).save(folder)
    return True


def export(ckpt_path, out, pooler_path=""):
    """Write the export folder `out` (which must not exist yet) from a checkpoint and, optionally, a saved pooler."""
    optional("safetensors", "export")  # model.safetensors
    if os.path.exists(out):
        raise UserError(f"--out={out} already exists; pick a new folder (or remove it) so nothing in it is lost")
    check_writable(out, "--out")
    try:
        model, ckpt = load_checkpoint(ckpt_path)
    except ValueError as e:
        raise UserError(str(e)) from None
    pooler, saved = load_pooler(pooler_path, "--pooler") if pooler_path else (None, None)
    if saved and saved["n_embd"] != model.config.n_embd:
        raise UserError(f"--pooler={pooler_path} is a pooler of {saved['n_embd']} dims, but --ckpt={ckpt_path} has "
                        f"n_embd={model.config.n_embd}; pass the checkpoint it was trained on, {saved['ckpt']}")
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(out))}.", dir=parent)
    try:
        info = dict(ckpt=ckpt_path, step=ckpt.get("step"), tokens=ckpt.get("tokens"), pooler=pooler_path or None)
        write_model(tmp, model, info, pooler, saved)
        write_tokenizer(tmp, model.config.block_size)
        st = write_sentence_transformers(tmp, model.config.block_size)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return st


def main(argv=None):
    s = configure(settings, argv, help_from=[__file__])
    t0 = time.time()
    with user_errors("export.py"):
        if not s["out"]:
            raise UserError("--out=FOLDER is needed: the folder to write (it must not exist yet)")
        st = export(s["ckpt"], s["out"], s["pooler"])
    files = sorted(os.listdir(s["out"]))
    size = sum(os.path.getsize(os.path.join(s["out"], f)) for f in files if os.path.isfile(os.path.join(s["out"], f)))
    print(f"wrote {s['out']} ({len(files)} files, {size / 1e6:.1f} MB) in {time.time() - t0:.1f}s; loads with "
          f"AutoModel.from_pretrained({s['out']!r}, trust_remote_code=True)"
          + (" and SentenceTransformer(..., trust_remote_code=True)" if st else ""))


if __name__ == "__main__":
    main()
