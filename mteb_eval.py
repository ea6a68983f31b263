"""
MTEB's own evaluators on the frozen backbone: the backbone (with a trained pooler, or plain mean pooling)
as an mteb encoder, and local STS sets as mteb tasks. Results go to mteb's standard results folder.
Optional: `pip install mteb`; embed.py imports this file only for --mteb.

    python embed.py --ckpt=out/ckpt.pt --mteb=STSBenchmark,Banking77Classification   # task data from the hub
    python embed.py --ckpt=out/ckpt.pt --mteb=../shared/glue/STS-B                    # a local STS set, offline
"""
import os
import sys

import mteb
from datasets import Dataset, DatasetDict
from mteb.abstasks.sts import AbsTaskSTS
from mteb.abstasks.task_metadata import TaskMetadata
from mteb.models.abs_encoder import AbsEncoder
from mteb.models.model_meta import ModelMeta, ScoringFunction

from data.tasks import EvalError, read_sts
from features import embed_texts


class Encoder(AbsEncoder):
    """mteb's encoder protocol: unit-norm embeddings of the backbone's last layer through the pooler."""

    def __init__(self, model, pooler, name, revision):
        self.model, self.pooler = model, pooler
        # the name ("org/model") and the revision name the results subfolder
        self.mteb_model_meta = ModelMeta.create_empty(dict(
            name=name, revision=revision, embed_dim=model.config.n_embd, n_parameters=model.num_params(),
            max_tokens=model.config.block_size, similarity_fn_name=ScoringFunction.COSINE, framework=["PyTorch"]))

    def encode(self, inputs, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs):
        # all texts at once: embed_texts() sorts them by length, which mteb's batches would not
        texts = [text for batch in inputs for text in batch["text"]]
        return embed_texts(self.model, self.pooler, texts).double().numpy()  # float64 cosines, as embed.eval_sts


class LocalSTS(AbsTaskSTS):
    """An STS set read by data.tasks.read_sts (GLUE's STS-B folder, or a SemEval-style file) as an mteb task."""

    def __init__(self, name, pairs):
        self.metadata = TaskMetadata(
            name=name, description=f"local STS set {name}", dataset=dict(path=name, revision="local"), type="STS",
            category="t2t", eval_splits=["test"], eval_langs=["eng-Latn"], main_score="cosine_spearman")
        super().__init__()
        s1, s2, score = zip(*pairs)
        self.dataset = DatasetDict(test=Dataset.from_dict(dict(sentence1=s1, sentence2=s2, score=score)))
        self.data_loaded = True


def get_tasks(spec):
    """mteb tasks of --mteb, with their data loaded: local STS sets (paths, as --sts takes) or mteb task names."""
    tasks = []
    for item in spec.split(","):
        if os.path.exists(item):
            tasks += [LocalSTS(name, pairs) for name, pairs in read_sts(item).items()]
            continue
        try:
            task = mteb.get_task(item)
            task.load_data()
        except KeyError:
            raise EvalError(f"--mteb: no mteb task {item!r} and no such path; use mteb's task names "
                            "(e.g. STSBenchmark) or a local STS set") from None
        except Exception as e:  # offline, hub down: all end here
            raise EvalError(f"--mteb: cannot load {item} from the hub ({str(e).splitlines()[0]}); "
                            "offline, pass a local STS set (e.g. --mteb=../shared/glue/STS-B)") from None
        tasks.append(task)
    return tasks


def run(model, pooler, tasks, out_dir, name, revision):
    """{"mteb/<task>": main score x100} of mteb's evaluation.

    Results go to out_dir/results/<name with __ for />/<revision>/<task>.json, as mteb writes them (overwritten).
    """
    result = mteb.evaluate(Encoder(model, pooler, name, revision), tasks, cache=mteb.ResultCache(out_dir),
                           overwrite_strategy="always", show_progress_bar=sys.stderr.isatty(),
                           encode_kwargs=dict(batch_size=256))
    return {f"mteb/{r.task_name}": 100 * float(r.get_score()) for r in result.task_results}
