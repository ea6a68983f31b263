"""
See what a checkpoint learned: fill masks, cut a sentence into CrossBERT's complementary views, find a text's nearest
neighbours (nanoGPT's sample.py, for masked-language models). Each model fills masks the way it trained (HOW below);
--detect asks ELECTRA's discriminator which tokens look replaced; neighbours are ranked by the cosine of the encoder's
mean-pooled last-layer features (embeddings/'s zero-shot embeddings).

    python sample.py --text="Once upon a <mask>, a <mask> lived in the woods."   # the top fills of each <mask>
    python sample.py --views="The old man looked out at the sea."               # what each view sees and fills
    python sample.py --neighbours=lines.txt --query="The ship sailed at dawn."   # the nearest lines of a file
    python sample.py --ckpt=out-electra/ckpt.pt --text="The dog <mask> at the cat." --detect
"""
import numpy as np
import torch

from evaluation.features import load_backbone
from configurator import UserError, configure, user_errors
from data.tokenizer import EOT, MASK, decode, encode, encode_masked
from plumbing.checks import at_least, check_device
from embeddings.vectors import embed_texts, read_texts, search
from masking import Views, make_views

settings = dict(
    ckpt="out/ckpt.pt",     # a train.py checkpoint (or snapshot)
    text="",                # a text with <mask>s to fill (or any text, with --detect)
    views="",               # a text to cut into the model's views, each filling the others
    neighbours="",          # a file of texts (.txt: one per line, or .jsonl)
    query="",               # with --neighbours: the text whose nearest lines to find
    detect=False,           # with --text, ELECTRA: which tokens look replaced
    top_k=5,                # fills per position, or neighbours
    seed=1337,              # --views: the seed of the random cut
    device="cuda" if torch.cuda.is_available() else "cpu",  # cpu, cuda or cuda:N
)

# how each family fills a masked position, printed above its fills
HOW = {"bert": "BERT reads the text with <mask> at the targets; its LM head fills them",
       "crossbert": "the encoder sees the visible tokens only; the predictor's queries fill the masked positions",
       "electra": "the generator (a narrow BERT) reads the text with <mask> at the targets and fills them"}


def row_texts(backbone):
    """row_text(row): the text an embedding row stands for (<unk>: the row of a compact vocabulary's rare ids)."""
    V = backbone.config.vocab_size
    if backbone.vocab_map is None:
        ids = np.arange(V)
    else:
        rows = backbone.vocab_map[:EOT + 1].cpu().numpy()  # the row of each text id
        alone = np.bincount(rows, minlength=V)[rows] == 1
        ids = np.full(V, -1)
        ids[rows[alone]] = np.flatnonzero(alone)
    return lambda row: decode([ids[row]]) if ids[row] >= 0 else "<unk>"


def shown(text):
    """A token as printed: without its leading space, or quoted when it is only whitespace."""
    return text.strip() or repr(text)


def piece(text):
    """A fill as printed: as shown(), with BERT's ## before a word piece glued to what comes before: " the" and "the"
    read apart."""
    return "##" + text if text[:1].isalnum() else shown(text)


def checked(ids, block_size, what):
    """The token ids of a text, which must fit in the model's block."""
    if len(ids) > block_size:
        raise UserError(f"{what} is {len(ids)} tokens, longer than the checkpoint's block of {block_size}: shorten it")
    if not ids:
        raise UserError(f"{what} is empty: pass some text")
    return ids


@torch.inference_mode()
def fills(backbone, ids, views):
    """The model's fills at each view's targets, as probabilities (N, M, rows) over the embedding rows a text can
    hold (those below <mask>, as ELECTRA samples); ids: the text's GPT-2 ids."""
    views = views.to(backbone.model.wte.weight.device)
    idx = backbone.ids(torch.tensor([ids], device=views.rows.device))[views.rows]
    return torch.softmax(backbone.model.fill(idx, views)[..., :backbone.config.mask_token_id].float(), dim=-1)


def top(probs, k, row_text):
    """The k likeliest fills of one position (probs: over the rows), as "word 0.412, ##piece 0.051, ..."."""
    p, rows = probs.topk(min(k, len(probs)))
    return ", ".join(f"{piece(row_text(r))} {q:.3f}" for q, r in zip(p.tolist(), rows.tolist()))


def masked(text, block_size, detect):
    """--text's ids, checked: a <mask> to fill (unless --detect), and some words to read."""
    ids = checked(encode_masked(text), block_size, "--text")
    if MASK not in ids and not detect:
        raise UserError('--text has no <mask>: put <mask> where a word should be filled, e.g. --text="Once upon a '
                        '<mask>."')
    if ids.count(MASK) == len(ids):
        raise UserError("--text is all <mask>: leave some words for the model to read")
    return ids


def cut(ids, config, seed):
    """--views: the text's ids and its views, as masking.py cuts a training row with the checkpoint's mask ratio (and
    complementary masking). Complementary views cut a row into equal chunks: <|endoftext|>, which separates the texts
    of the training windows, pads the text to a multiple of their number."""
    ids = ids + [EOT] * (-len(ids) % config.views[0])
    try:
        seeded = torch.Generator().manual_seed(seed)
        return ids, make_views(1, len(ids), config.mask_ratio, config.cms, generator=seeded)
    except ValueError:
        raise UserError(f"--views is {len(ids)} tokens, too short to mask {config.mask_ratio:g} of it and keep the "
                        "rest: pass a longer text") from None


def fill_masks(backbone, text, ids, k, row_text):
    """--text: the top-k fills of each <mask>, with their probabilities. Returns {each <mask>'s position: its top
    fill, an embedding row}."""
    where = [i for i, t in enumerate(ids) if t == MASK]
    seen = [i for i in range(len(ids)) if i not in where]
    one_view = Views(torch.zeros(1, dtype=torch.long), torch.tensor([seen]), torch.tensor([where]))
    probs = fills(backbone, ids, one_view)[0]
    print(text)
    for j, p in enumerate(probs, 1):
        print(f"<mask> {j}: {top(p, k, row_text)}")
    return dict(zip(where, probs.argmax(-1).tolist()))


@torch.inference_mode()
def detect(backbone, text, ids, k, row_text):
    """--detect (ELECTRA): the discriminator's probability that each token of the text was replaced, its <mask>s
    filled first by the generator (its top fill, where training samples one)."""
    filled = fill_masks(backbone, text, ids, k, row_text) if MASK in ids else {}
    rows = backbone.ids(torch.tensor(ids, device=backbone.model.wte.weight.device))
    for pos, row in filled.items():
        rows[pos] = row
    p = torch.sigmoid(backbone.model.discriminate(rows[None]))[0].tolist()
    print("the discriminator's probability that each token was replaced:")
    for pos, (t, q) in enumerate(zip(ids, p)):
        word = shown(row_text(filled[pos]) if pos in filled else decode([t]))
        print(f"  {q:.3f}  {word}" + ("   <- replaced?" if q > 0.5 else ""))


def show_views(backbone, ids, views, k, row_text):
    """--views: what each view's model sees of the text, and its fills at the other positions with the true token's
    rank. Returns the ranks, in the order printed."""
    cfg = backbone.config
    probs = fills(backbone, ids, views)
    true_rows = backbone.ids(torch.tensor(ids, device=probs.device))
    words = [decode([t]) for t in ids]
    ranks = []
    print(f"{len(ids)} tokens, {len(views.rows)} view(s), mask ratio {cfg.mask_ratio:g}" +
          (" (complementary: each view predicts what the others see)" if cfg.cms else ""))
    for v, (seen, targets) in enumerate(zip(views.visible_pos.tolist(), views.target_pos.tolist())):
        sentence = "".join(w if i in seen else w[:len(w) - len(w.lstrip())] + "_" * len(w.strip() or "_")
                           for i, w in enumerate(words))
        print(f"view {v + 1}: sees {len(seen)} tokens: {sentence}")
        for pos, p in sorted(zip(targets, probs[v]), key=lambda x: x[0]):
            truth = true_rows[pos]  # the true token as the model knows it (<unk>: outside a compact vocabulary)
            ranks.append(int((p > p[truth]).sum()) + 1)
            print(f"  {shown(row_text(truth)):>12}  rank {ranks[-1]:<5}  {top(p, k, row_text)}")
    print(f"the top fill is the true token at {ranks.count(1)} of {len(ranks)} positions; median rank "
          f"{int(np.median(ranks))}")
    return ranks


def neighbours(backbone, path, lines, query, k):
    """--neighbours: the k lines (line number, text) nearest to the query, by cosine similarity of the encoder's
    embeddings."""
    d = embed_texts(backbone, None, [t for _, t in lines])
    q = embed_texts(backbone, None, [query])
    hits = search(q, d, min(k, len(lines)), torch.tensor([-1]))[0]
    print(f"the {len(hits)} lines of {path} ({len(lines):,} texts) nearest to the query, by cosine similarity:")
    for r in hits.tolist():
        n, t = lines[r]
        print(f"  {float(q[0] @ d[r]):.3f}  line {n}: {t if len(t) <= 100 else t[:97] + '...'}")


def main(argv=None):
    s = configure(settings, argv, help_from=[__file__])
    with user_errors("sample.py"):
        check_device(s["device"])
        if bool(s["neighbours"]) != bool(s["query"]):
            raise UserError("--neighbours=FILE and --query=TEXT go together: the lines of FILE nearest to TEXT")
        if sum(map(bool, (s["text"], s["views"], s["neighbours"]))) != 1:
            raise UserError("pass one of --text=..., --views=... or --neighbours=FILE --query=...")
        if s["detect"] and not s["text"]:
            raise UserError("--detect reads --text=...: the text whose replaced tokens to find")
        at_least(s, 1, ("top_k",))
        run(s)


def run(s):
    try:
        backbone, ckpt = load_backbone(s["ckpt"], s["device"])
    except ValueError as e:  # a shape no model can have, in a checkpoint's settings
        raise UserError(str(e)) from None
    cfg = backbone.config
    if s["detect"] and cfg.model_type != "electra":
        raise UserError(f"--detect asks ELECTRA's discriminator, and {s['ckpt']} holds a {cfg.model_type} model: pass "
                        "an ELECTRA checkpoint (python train.py config/tiny_electra.py)")
    # the input, checked before anything is printed
    if s["text"]:
        ids = masked(s["text"], cfg.block_size, s["detect"])
    elif s["views"]:
        ids, views = cut(checked(encode(s["views"]), cfg.block_size, "--views"), cfg, s["seed"])
    else:
        checked(encode(s["query"]), cfg.block_size, "--query")
        lines = [(n, t) for n, t in enumerate(read_texts(s["neighbours"], "text", "--neighbours"), 1) if t.strip()]
    row_text = row_texts(backbone)
    print(f"{cfg.model_type} {cfg.n_layer} x {cfg.n_embd}" + (f", step {ckpt['step']}" if "step" in ckpt else "") +
          f" ({s['ckpt']})" + ("" if s["neighbours"] else f": {HOW[cfg.model_type]}"))
    if s["detect"]:
        detect(backbone, s["text"], ids, s["top_k"], row_text)
    elif s["text"]:
        fill_masks(backbone, s["text"], ids, s["top_k"], row_text)
    elif s["views"]:
        show_views(backbone, ids, views, s["top_k"], row_text)
    else:
        neighbours(backbone, s["neighbours"], lines, s["query"], s["top_k"])


if __name__ == "__main__":
    main()
