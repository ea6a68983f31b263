"""
Fine-tune an exported model on a GLUE task with transformers' Trainer, as a user of the HF ecosystem does: the export's
AutoModelForSequenceClassification and AutoTokenizer, the Trainer, dynamic padding; the dev score each epoch with the
task's GLUE metric (probe.py's). The paper judges frozen features (probe.py); this is the other way to use an encoder.

    python hf/export.py --ckpt=out/ckpt.pt --out=exported/my-model
    python hf/finetune.py --model=exported/my-model --task=SST-2 --glue_dir=glue_data --out=finetuned/sst2
    python hf/finetune.py --model=exported/my-model --task=SST-2 --freeze=True --out=finetuned/head  # the head alone

The fine-tuned model is saved to --out (save_pretrained: it loads as the export does, with the task's label names as
id2label), a new folder: an existing one only with --overwrite=True, and never --model itself. Regression tasks (STS-B)
get one output and the MSE loss, classification tasks one output per class and cross-entropy (transformers'
problem_type rule). Needs transformers and accelerate.
"""
import os
import re
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the project's modules, when run as `python hf/finetune.py`
from configurator import UserError, configure, user_errors
from data import tasks
from plumbing.checks import at_least, check_writable, optional
from evaluation.metrics import METRICS

settings = dict(
    model="",               # an hf/export.py folder (needed)
    task="SST-2",           # a GLUE task name, or a folder holding train.tsv and dev.tsv (probe.py's --tasks)
    glue_dir="",            # local GLUE folder (PATH/<TASK>/train.tsv, dev.tsv); empty = from the hub
    max_train=0,            # keep a seeded random subset of train, probe.py's (0 = all)
    epochs=3,
    batch_size=32,
    learning_rate=3e-4,     # a small encoder takes a larger rate than BERT-base's 2e-5
    freeze=False,           # True: train the head alone, on the frozen encoder
    seed=1337,              # the head's initialisation and the batches' order
    out="",                 # the folder for the fine-tuned model (needed); it must not exist yet
    overwrite=False,        # True: --out may exist, and its files are replaced (never --model's)
)


def encode(tokenizer, texts, labels):
    """The Trainer's examples: each text (a sentence, or a pair) tokenised and cut to the model's block, and its
    label."""
    columns = [list(c) for c in zip(*texts)]
    batch = tokenizer(*columns, truncation=True)
    return [dict(input_ids=i, attention_mask=m, labels=y) for i, m, y in
            zip(batch["input_ids"], batch["attention_mask"], labels.tolist())]


def check_out(s):
    """--out is a new folder (or --overwrite=True), and never --model, which the fine-tuned model would replace."""
    if os.path.realpath(s["out"]) == os.path.realpath(s["model"]):
        raise UserError(f"--out={s['out']} is --model: the fine-tuned model would replace the export; pick a new "
                        "folder")
    if os.path.exists(s["out"]) and not s["overwrite"]:
        raise UserError(f"--out={s['out']} already exists; pick a new folder, or pass --overwrite=True to replace its "
                        "files")


def load_task(s):
    """tasks.load_task, its messages naming this script's settings (they name the evaluators' by default)."""
    try:
        return tasks.load_task(s["task"], s["glue_dir"] or None, s["max_train"], s["seed"])
    except UserError as e:
        message = re.sub(f"leave (.+?) out of {re.escape(tasks.TASKS)}", "pick another --task", str(e))
        raise UserError(message.replace(tasks.GLUE_DIR, "--glue_dir")) from None


def finetune(s):
    if not os.path.isfile(os.path.join(s["model"], "config.json")):
        raise UserError(f"--model={s['model']} is not an exported folder (no config.json); write one with "
                        "python hf/export.py --ckpt=CKPT --out=FOLDER")
    check_out(s)
    task = load_task(s)  # before transformers is imported: a wrong task is named at once
    transformers = optional("transformers", "hf/finetune.py")
    optional("accelerate", "hf/finetune.py (transformers' Trainer)")  # the Trainer runs on it; transformers lacks it
    regression = task["classes"] is None
    labels = {} if regression else dict(id2label=dict(enumerate(task["classes"])),
                                        label2id={c: i for i, c in enumerate(task["classes"])})
    tokenizer = transformers.AutoTokenizer.from_pretrained(s["model"], trust_remote_code=True)
    transformers.set_seed(s["seed"])  # the new head's weights
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        s["model"], trust_remote_code=True, num_labels=1 if regression else len(task["classes"]), **labels)
    if s["freeze"]:
        model.base_model.requires_grad_(False)

    def dev_score(prediction):
        logits, gold = prediction
        pred = logits[:, 0] if regression else logits.argmax(-1)
        values = {m: 100 * METRICS[m](pred, gold) for m in task["metrics"]}
        return dict(score=float(np.mean(list(values.values()))), **values)  # GLUE's mean of a task's two metrics

    args = transformers.TrainingArguments(
        output_dir=s["out"], num_train_epochs=s["epochs"], per_device_train_batch_size=s["batch_size"],
        per_device_eval_batch_size=256, learning_rate=s["learning_rate"], eval_strategy="epoch",
        logging_steps=max(1, len(task["train"][1]) // s["batch_size"] // 10), save_strategy="no", report_to="none",
        seed=s["seed"], disable_tqdm=True)
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=encode(tokenizer, *task["train"]),
        eval_dataset=encode(tokenizer, *task["dev"]), data_collator=transformers.DataCollatorWithPadding(tokenizer),
        compute_metrics=dev_score)
    trainer.train()
    trainer.save_model(s["out"])
    return trainer.state.log_history


def main(argv=None):
    s = configure(settings, argv, help_from=[__file__])
    with user_errors("finetune.py"):
        for name in ("model", "out"):
            if not s[name]:
                raise UserError(f"--{name}=FOLDER is needed: " + ("an hf/export.py folder" if name == "model" else
                                                                   "where the fine-tuned model goes"))
        at_least(s, 1, ("epochs", "batch_size"))
        check_writable(s["out"], "--out")
        history = finetune(s)
    scores = [r for r in history if "eval_score" in r]
    print(f"{s['task']} dev score by epoch: " + ", ".join(f"{r['eval_score']:.1f}" for r in scores) +
          f"; fine-tuned model in {s['out']}")


if __name__ == "__main__":
    main()
