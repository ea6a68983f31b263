"""
Export a trained encoder, with what fills its masks, to a folder the HF ecosystem loads: transformers' Auto classes,
pipeline("fill-mask") and the Trainer, and sentence-transformers.

    python hf/export.py --ckpt=out/ckpt.pt --out=exported/my-model                          # encoder + what fills masks
    python hf/export.py --ckpt=out/ckpt.pt --pooler=pooler.pt --out=exported/my-embedder      # with embed.py's pooler
    python hf/export.py --ckpt=out/ckpt.pt --encoder_only=True --out=exported/my-encoder      # the encoder alone
    python hf/export.py --ckpt=random --like=out/ckpt.pt --out=exported/my-twin               # its random-init twin

    from transformers import AutoModel, AutoTokenizer, pipeline
    model = AutoModel.from_pretrained("exported/my-model", trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained("exported/my-model", trust_remote_code=True)
    out = model(**tokenizer(["a text", "another"], padding=True, truncation=True, return_tensors="pt"))
    out.last_hidden_state, out.pooler_output    # model.encode()'s states; embed.py's unit-norm embedding
    pipeline("fill-mask", model="exported/my-model", trust_remote_code=True)("Once upon a <mask>.")  # = sample.py
    # AutoModelForSequenceClassification / ForTokenClassification: heads to fine-tune (hf/finetune.py runs the Trainer)

    from sentence_transformers import SentenceTransformer
    SentenceTransformer("exported/my-embedder", trust_remote_code=True).encode(["a text"])  # = embed.py --texts

The folder holds:
  model.safetensors      the trained model's weights under model.py's names (and the pooler's), no optimizer: the
                         encoder and what fills masks (BERT's LM head, CrossBERT's predictor, ELECTRA's generator and
                         discriminator head); with --encoder_only=True, the encoder alone. And vocab_map, the map from
                         GPT-2 ids to the model's that its data was read through (the same ids without a compact
                         vocabulary), which the exported classes apply to their input
  config.json            the encoder's ModelConfig, the whole model's (unless --encoder_only), the pooler's kind, and
                         the family that trained it
  modeling_crossbert.py  the Auto classes (beside this script), with copies of model.py and masking.py, and poolers.py
                         (the source of embeddings/vectors.py's poolers): the exported model runs the code it was
                         trained with, not a second implementation, and imports nothing from this project
  tokenizer.json, tokenizer_config.json   GPT-2's BPE, written from data/gpt2.tiktoken: <mask> is its mask token,
                         pairs are joined by <|endoftext|> as evaluation/features.py joins them, and <unk> (the
                         first padding id) names the compact vocabulary's <unk> among the fills
  modules.json, ...      sentence-transformers' files, when it (6.0 or later) is installed
  README.md              the model card: the family and size, the paper, how to load it, its training data, steps,
                         tokens and FLOPs, its val loss against the unigram baseline (from log.jsonl beside the
                         checkpoint, when there), and the commit of the code that trained it

Needs safetensors (transformers brings it); loading needs transformers. A missing extra is named with its pip command.
The folder is built beside --out and renamed into place at the end: a failed export leaves nothing behind.
"""
import inspect
import json
import os
import shutil
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)  # the project's modules, when run as `python hf/export.py`
from configurator import UserError, configure, user_errors
from data.tokenizer import EOT, MASK, PAD, VOCAB_SIZE, load_ranks
from embeddings.vectors import POOLERS, load_pooler
from evaluation.features import load_backbone, mean_pool, random_twin
from plumbing.checks import check_writable, optional

settings = dict(
    ckpt="out/ckpt.pt",     # a train.py checkpoint, or random (with --like: that checkpoint's random-init twin)
    like="",                # with --ckpt=random: the checkpoint whose shape and vocabulary map the twin takes
    seed=1337,              # with --ckpt=random: the twin's weights
    pooler="",              # an embed.py --save_pooler file trained on --ckpt ("" = mean pooling)
    encoder_only=False,     # True: the encoder alone (embeddings, task heads), without what fills masks
    out="",                 # the folder to write (needed); it must not exist yet
)

ENCODER_KEYS = ("wte.", "ln_e.", "blocks.", "ln_f.")  # model.py's shared stack: every family's encoder
CODE = ("model.py", "masking.py")  # what modeling_crossbert.py runs, copied whole
UNK = PAD + 1  # the first padding id names a compact vocabulary's <unk> row among the fills
PAPER = '"Separating Representation from Reconstruction Enables Scalable Text Encoders" (ICML 2026)'
FAMILIES = {
    "crossbert": "CrossBERT, the paper's model: its encoder reads only the visible tokens, and a shallow predictor of "
                 "cross-attention blocks fills the masked ones from its states, so the encoder never reconstructs",
    "bert": "BERT, the paper's flat baseline: every layer reads the text with <mask> at the masked tokens",
    "electra": "ELECTRA, the paper's other baseline: the encoder is the discriminator that tells which tokens a narrow "
               "generator replaced"}


def model_state(backbone, encoder_only):
    """The tensors of a trained model of any family (its encoder's alone, if encoder_only), under the names the
    exported model gives them: model.py's, under `model.`; and vocab_map, the map from GPT-2 ids to the model's."""
    tensors = {f"model.{k}": v.detach().cpu().contiguous() for k, v in backbone.model.state_dict().items()
               if not encoder_only or k.startswith(ENCODER_KEYS)}
    vmap = backbone.vocab_map
    tensors["vocab_map"] = torch.arange(VOCAB_SIZE) if vmap is None else vmap.cpu().contiguous()  # None: the same ids
    return tensors


def encoder_config(config):
    """The ModelConfig fields of the exported encoder: the trained shape, as a BERT (whose encode() is the same stack,
    so every family exports alike; the exported classes drop its LM head); the masking settings are training's, not
    kept."""
    args = {k: v for k, v in vars(config).items() if k not in ("mask_ratio", "cms", "pred_layer", "gen_layer",
                                                                  "random_replace")}
    return dict(args, model_type="bert")


def pooler_code():
    """poolers.py of the export: the source of embeddings/vectors.py's poolers and of the mean pooling they use, copied
    alone (the rest of those files reads the project's data and checkpoints, which an export has no use for)."""
    table = ", ".join(f"{kind!r}: {cls.__name__}" for kind, cls in POOLERS.items())
    sources = [inspect.getsource(f) for f in (mean_pool, *POOLERS.values())]
    return ('"""The poolers of embeddings/vectors.py and the mean pooling of evaluation/features.py, copied by '
            'hf/export.py."""\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n'
            + "\n\n".join(sources) + f"\n\nPOOLERS = {{{table}}}\n")


def byte_stand_ins():
    """GPT-2's table of printable stand-ins for the 256 bytes, as HF's byte-level BPE files spell tokens: printable
    Latin-1 bytes stand for themselves, the others take the code points from 256 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    table = {b: chr(b) for b in printable}
    table.update({b: chr(256 + i) for i, b in enumerate(others)})
    return table


def bpe_files(ranks):
    """(vocab, merges) of an HF BPE model (tokenizer.json) from tiktoken's ranks {token bytes: id}. A token's merge is
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
    vocab.update({"<|endoftext|>": EOT, "<mask>": MASK, "<pad>": PAD, "<unk>": UNK})
    return vocab, merges


def write_tokenizer(folder, block_size):
    """tokenizer.json (the tokenizers library's format, written out here) and tokenizer_config.json: GPT-2's BPE as
    data/tokenizer.py encodes, no BOS or EOS added. <|endoftext|>, <mask> and <pad> are its special tokens, and their
    spellings in a text are read as them, as transformers' tokenizers do (the fill-mask pipeline finds <mask> so);
    the spaces before a <mask> belong to it, as in encode_masked(). Pairs are a <|endoftext|> b, as
    evaluation/features.py joins them; texts are cut at block_size tokens, from the longer side of a pair first."""
    vocab, merges = bpe_files(load_ranks())
    special = [dict(id=i, content=t, single_word=False, lstrip=t == "<mask>", rstrip=False, normalized=False,
                    special=True) for t, i in (("<|endoftext|>", EOT), ("<mask>", MASK), ("<pad>", PAD))]
    byte_level = dict(type="ByteLevel", add_prefix_space=False, trim_offsets=True, use_regex=True)
    sequence = lambda s, type_id: {"Sequence": {"id": s, "type_id": type_id}}  # noqa: E731
    separator = {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": special, "normalizer": None,
        "pre_tokenizer": byte_level, "decoder": byte_level,
        "post_processor": {"type": "TemplateProcessing", "single": [sequence("A", 0)],
                           "pair": [sequence("A", 0), separator, sequence("B", 1)],
                           "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [EOT],
                                                                "tokens": ["<|endoftext|>"]}}},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges}}
    with open(os.path.join(folder, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(dict(tokenizer_class="PreTrainedTokenizerFast", model_max_length=block_size, padding_side="right",
                       truncation_side="right", model_input_names=["input_ids", "attention_mask"],
                       pad_token="<pad>", mask_token="<mask>", sep_token="<|endoftext|>"), f, indent=2)


def write_model(folder, backbone, ckpt_info, pooler, saved, encoder_only):
    from safetensors.torch import save_file  # export() checked that safetensors is installed
    tensors = model_state(backbone, encoder_only)
    if pooler is not None:
        tensors.update({f"pooler.{k}": v.detach().cpu().contiguous() for k, v in pooler.state_dict().items()})
    save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    cfg = backbone.config
    classes = ("Config", "EncoderConfig"), ("Model", "EncoderModel"), ("ModelForMaskedLM", "ForMaskedLM"), \
        ("ModelForSequenceClassification", "ForSequenceClassification"), \
        ("ModelForTokenClassification", "ForTokenClassification")
    config = dict(
        architectures=["CrossBERTEncoderModel" if encoder_only else "CrossBERTForMaskedLM"],
        model_type="crossbert_encoder",
        auto_map={f"Auto{auto}": f"modeling_crossbert.CrossBERT{ours}" for auto, ours in classes},
        encoder=encoder_config(cfg), masked_lm=None if encoder_only else vars(cfg),
        pooler=None if saved is None else {k: saved[k] for k in ("kind", "n_embd", "n_head")},
        trained_as=cfg.model_type, hidden_size=cfg.n_embd, num_hidden_layers=cfg.n_layer,
        num_attention_heads=cfg.n_head, max_position_embeddings=cfg.block_size, vocab_size=VOCAB_SIZE,
        pad_token_id=PAD, mask_token_id=MASK, unk_token_id=UNK, torch_dtype="float32", trained=ckpt_info)
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
    with open(os.path.join(folder, "poolers.py"), "w") as f:
        f.write(pooler_code())


def run_log(ckpt_path, step):
    """(val loss, unigram baseline, probes) of the run's log.jsonl beside the checkpoint: its last val loss and
    frozen-probe record (train.py's probe_interval) up to the checkpoint's step, and the first record's unigram loss;
    Nones without a log or such records."""
    path = os.path.join(os.path.dirname(os.path.abspath(ckpt_path)), "log.jsonl")
    if not os.path.isfile(path):
        return None, None, None
    with open(path) as f:
        records = [r for r in map(json.loads, filter(str.strip, f)) if step is None or r.get("step", 0) <= step]
    last = lambda key: next((r for r in reversed(records) if key in r), None)
    val, probes = last("val_loss"), last("probe")
    return (val and val["val_loss"]), (records[0].get("unigram_loss") if records else None), probes


def model_card(name, backbone, ckpt, info, encoder_only):
    """README.md of the export: what the model is, how to load it, what trained it (from the checkpoint, and the
    run's log.jsonl beside it)."""
    cfg, model = backbone.config, backbone.model
    encoder = sum(p.numel() for k, p in model.named_parameters() if k.startswith(ENCODER_KEYS))
    run = ckpt.get("config") or {}
    code = ckpt.get("code") or {}
    if info["ckpt"] == "random":
        training = [f"- untrained: the random-init twin (seed {info['seed']}) of {info['like']}, its shape and "
                    "vocabulary, the baseline a trained encoder must beat"]
    else:
        val, unigram, probes = run_log(info["ckpt"], ckpt.get("step"))
        flops, tokens = ckpt.get("flops"), ckpt.get("tokens")
        training = [f"- data: {run.get('dataset', 'not recorded')}",
                    f"- steps: {ckpt.get('step', 'not recorded')}; tokens: "
                    + (f"{tokens:,}" if tokens is not None else "not recorded") + "; training FLOPs: "
                    + (f"{flops:.3g}" if flops is not None else "not recorded"),
                    "- validation loss of the masked tokens: " + ("not recorded (no log.jsonl beside the checkpoint)"
                                                                   if val is None else f"{val:.4f} nats")
                    + ("" if val is None or unigram is None else f", {abs(unigram - val):.3f} nats "
                       f"{'below' if unigram >= val else 'above'} the unigram baseline's {unigram:.4f} (a model "
                       "that ignores context)"),
                    "- frozen probes of the last layer (probe.py's linear and kNN, in percent): "
                    + ("not recorded (train.py's probe_interval was 0)" if not probes else f"at step {probes['step']}, "
                       + ", ".join(f"{k} {v:.1f}" for k, v in probes["probe"].items()))]
    commit = code.get("commit")
    training.append("- code: " + ("not recorded" if not commit else f"commit {commit}"
                                  + (" with uncommitted changes" if code.get("dirty") else "")))
    fill = [] if encoder_only else [f'pipeline("fill-mask", model="{name}", trust_remote_code=True)("Once upon a '
                                    '<mask>.")']
    size = (f"{cfg.n_layer} layers of width {cfg.n_embd} with {cfg.n_head} heads, {encoder / 1e6:.2f}M parameters in "
            f"the encoder ({sum(p.numel() for p in model.parameters()) / 1e6:.2f}M in all), a vocabulary of "
            f"{cfg.vocab_size} ids, {cfg.block_size} tokens a text")
    return "\n".join([
        "---", "library_name: transformers", f"pipeline_tag: {'feature-extraction' if encoder_only else 'fill-mask'}",
        f"tags: [{', '.join(dict.fromkeys(['crossbert', cfg.model_type, 'sentence-transformers']))}]", "---", "",
        f"# {os.path.basename(os.path.abspath(name))}", "",
        f"A text encoder trained as {FAMILIES[cfg.model_type]}. {size}"
        + (", exported without what fills masks (the encoder alone)." if encoder_only else "."), "",
        f"It comes from the reference implementation of CrossBERT, the paper {PAPER}.", "",
        "## Use", "", "The model runs its own code (modeling_crossbert.py and the model.py it was trained with), "
        "so loading it needs `trust_remote_code=True`:", "", "```python",
        "from transformers import AutoModel, AutoTokenizer, pipeline",
        f'tokenizer = AutoTokenizer.from_pretrained("{name}", trust_remote_code=True)',
        f'model = AutoModel.from_pretrained("{name}", trust_remote_code=True)',
        'out = model(**tokenizer(["a text", "another"], padding=True, truncation=True, return_tensors="pt"))',
        "out.last_hidden_state, out.pooler_output  # the states of each token; the unit-norm sentence embedding",
        *fill, "",
        "from sentence_transformers import SentenceTransformer",
        f'SentenceTransformer("{name}", trust_remote_code=True).encode(["a text"])', "```", "",
        "AutoModelForSequenceClassification and AutoModelForTokenClassification put a new linear head on the encoder "
        "to fine-tune" + ("." if encoder_only else "; AutoModelForMaskedLM takes `labels` for continued pretraining "
                          "(the Trainer with DataCollatorForLanguageModeling)."), "",
        "## Training", "", *training, ""])


def write_sentence_transformers(folder, block_size):
    """sentence-transformers' files in the same folder: one module, the exported encoder, whose pooler_output is the
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
    # saved aside, and only its own files kept: its save would write the encoder alone over the export's weights
    scratch = os.path.join(folder, "sentence-transformers")
    SentenceTransformer(modules=[module]).save(scratch)
    for name in os.listdir(scratch):
        if not os.path.exists(os.path.join(folder, name)):
            os.rename(os.path.join(scratch, name), os.path.join(folder, name))
    shutil.rmtree(scratch)
    return True


def export(ckpt_path, out, pooler_path="", encoder_only=False, like="", seed=1337):
    """Write the export folder `out` (which must not exist yet) from a checkpoint, or the random twin of `like` (with
    ckpt_path "random"), and, optionally, a saved pooler."""
    if os.path.exists(out):
        raise UserError(f"--out={out} already exists; pick a new folder (or remove it) so nothing in it is lost")
    if bool(like) != (ckpt_path == "random"):
        raise UserError("--ckpt=random and --like=CKPT go together: the random-init twin of CKPT")
    check_writable(out, "--out")
    try:
        backbone, ckpt = load_backbone(like or ckpt_path)
    except ValueError as e:
        raise UserError(str(e)) from None
    info = dict(ckpt=ckpt_path, step=ckpt.get("step"), tokens=ckpt.get("tokens"), pooler=pooler_path or None)
    if like:  # the baseline a trained checkpoint must beat: its shape and vocabulary map, fresh weights
        backbone = random_twin(backbone, seed)
        info = dict(ckpt="random", like=like, seed=seed, pooler=pooler_path or None)
    pooler, saved = load_pooler(pooler_path, "--pooler") if pooler_path else (None, None)
    if saved and saved["n_embd"] != backbone.config.n_embd:
        raise UserError(f"--pooler={pooler_path} is a pooler of {saved['n_embd']} dims, but --ckpt={ckpt_path} has "
                        f"n_embd={backbone.config.n_embd}; pass the checkpoint it was trained on, {saved['ckpt']}")
    optional("safetensors", "export")  # model.safetensors; checked after the inputs, so a bad one is named first
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(out))}.", dir=parent)
    try:
        write_model(tmp, backbone, info, pooler, saved, encoder_only)
        write_tokenizer(tmp, backbone.config.block_size)
        with open(os.path.join(tmp, "README.md"), "w") as f:  # sentence-transformers' generic card is not kept
            f.write(model_card(out, backbone, ckpt, info, encoder_only))
        st = write_sentence_transformers(tmp, backbone.config.block_size)
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
        st = export(s["ckpt"], s["out"], s["pooler"], s["encoder_only"], s["like"], s["seed"])
    files = sorted(os.listdir(s["out"]))
    size = sum(os.path.getsize(os.path.join(s["out"], f)) for f in files if os.path.isfile(os.path.join(s["out"], f)))
    print(f"wrote {s['out']} ({len(files)} files, {size / 1e6:.1f} MB) in {time.time() - t0:.1f}s; loads with "
          f"AutoModel.from_pretrained({s['out']!r}, trust_remote_code=True), the task heads' Auto classes"
          + ("" if s["encoder_only"] else ', AutoModelForMaskedLM (pipeline("fill-mask"))')
          + (" and SentenceTransformer(..., trust_remote_code=True)" if st else ""))


if __name__ == "__main__":
    main()
