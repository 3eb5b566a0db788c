"""``llmattr finetune``: teach a causal LM a task in the task's own prompt, so the papers' protocols mean something.

Papers 003 and 004 explain *fine-tuned* models. Two training losses (``loss``; docs/finetune.md):

- ``label`` (the default): each sequence is the task's prompt exactly as ``explain``/``evaluate`` build it
  (:func:`llmattr.prompting.build_prompt`: system turn, user turn, the chat template's assistant header) followed by
  the token of the gold label word, and the loss is the cross-entropy of that one token at the answer position::

      L(theta) = -1/B sum_b log p_theta(y_b | prompt_b)

- ``lm`` (paper 004 sec. 5: "fine-tuned the models as ... language models" on the reviews): causal language
  modelling on the examples' own text, every token after the first::

      L(theta) = -1/B sum_b 1/T_b sum_t log p_theta(x_t | x_<t)

The loop is transformers' :class:`~transformers.Trainer` (AdamW, linear decay, a checkpoint every ``save_steps``,
resumed from the last one when the same command runs again; deterministic under ``seed`` on a CPU); ``lora_r > 0``
trains LoRA adapters (``peft``) and merges them, so the output is always a plain Hugging Face folder
(``save_pretrained`` + tokenizer) that ``--model DIR`` loads everywhere, with a model card
(:mod:`llmattr.models.card`) naming the base model, task, data, training ids, seed, hyper-parameters and the
accuracy on a held-out split (balanced per class, seeded) that training never sees, with its 95% bootstrap interval.
"""

from __future__ import annotations

import importlib.util
import json
import math
import random
import shutil
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import InitVar, asdict, dataclass, replace
from pathlib import Path

from .checks import mask_rate, one_of, positive_int
from .declarations import asked, held_out_summary
from .errors import LlmattrError, article
from .evaluation.accuracy import label_predictions
from .faithfulness.ffidelity import augment_mask
from .lazy import derived, lazy, torch
from .model_card import CARD_NAME, card_path, content_hash, read_card
from .models.loading import LoadedModel, load_model
from .prompting import build_prompt
from .stats import estimate, stable_seed
from .tasks import Task, get_task, load_examples
from .tasks.base import task_facts
from .tasks.catalog import HEAD_TASKS, STSB_REGRESSION, head_version
from .tasks.datasets import sample, sample_data
from .tasks.files import read_file_examples
from .version import __version__

transformers = lazy("transformers")
trainer_utils = lazy("transformers.trainer_utils")
scipy_stats = lazy("scipy.stats")

LOSSES = ("label", "lm")
HEADS = ("classification", "regression")  # --head: a sequence head on the last token's state (paper 003)
CHECKPOINTS = "checkpoints"  # Trainer's checkpoints inside the output folder, removed once the model is written


@dataclass
class FinetuneConfig:
    """What ``llmattr finetune`` trains; every field is a CLI option and is recorded in the model card.

    ``loss`` is the training loss (:data:`LOSSES`), not what a method explains (``explain --objective``);
    ``objective=`` is its name before issue 39, still read (a script or call written then keeps working)."""

    task: str = asked("sst2", "Classification task with label words (sst2, imdb, boolq, qnli, mnli, sentiment for "
                              "your own file).", str)
    data: str | None = asked(None, "Your own JSONL/CSV/TSV file (default: the task's sample data).", Path)
    text_field: str | None = asked(None, "--data: the column holding the text (default: the task's field).", str)
    label_field: str | None = asked(None, "--data: the column holding the label (default: label).", str)
    labels: str | None = asked(None, "--data: label words, e.g. Positive,Negative, or file value=word pairs, e.g. "
                                     "0=Negative,1=Positive (default: the task's).", str)
    loss: str = asked("label", "The training loss. label: the label word after the task's prompt; lm: language "
                               "modelling on the texts (paper 004).", str)
    held_out: int = asked(80, "Rows kept out of training (balanced per class) for the held-out accuracy.", int)
    epochs: int = asked(3, "Passes over the training rows.", int)
    learning_rate: float = asked(1e-5, "AdamW learning rate (linear decay to 0).", float)
    batch_size: int = asked(8, "Rows per optimizer step.", int)
    max_tokens: int = asked(256, "Cut each text field to this many tokens (IMDb's length cap).", int)
    lora_r: int | None = asked(None, "0: full fine-tuning; a rank r >= 1: LoRA adapters (peft), merged at the end "
                                     "(default: 4 with --head, paper 003's recipe; else 0).", int)
    seed: int = asked(0, "Seed of the split, the data order and the initialisation of adapters.", int)
    save_steps: int = asked(50, "Checkpoint every this many steps (resume point after an interrupt).", int)
    logging_steps: int = 5
    load_in_4bit: bool = asked(False, "4-bit frozen weights + LoRA (bitsandbytes, a CUDA GPU).", bool, "--load-in-4bit")
    head: str | None = asked(None, "classification or regression: train a sequence head on the last token's state "
                                   "(paper 003; tasks NAME-head, stsb-regression) instead of label words.", str)
    permute_labels: bool = asked(False, "Train on the training rows' labels permuted (the data randomisation sanity "
                                        "check's model; held-out rows keep theirs).", bool, "--permute-labels")
    mask_augment: float = asked(0.0, "F-Fidelity's random-mask fine-tuning: each training row loses a random subset "
                                     "of up to this fraction of its text tokens (deleted), new each epoch (0: off; "
                                     "e.g. 0.1; docs/trust.md).", float)
    objective: InitVar[str | None] = None

    def __post_init__(self, objective: str | None) -> None:
        """``objective=`` (the old name) gives ``loss``; another ``loss`` beside it is refused."""
        self.loss = training_loss(self.loss, objective, LOSSES[0])

    @property
    def rank(self) -> int:
        """The LoRA rank trained: ``lora_r``, or by default 4 with a ``head`` (paper 003's recipe) and 0 (full
        fine-tuning) without."""
        return lora_rank(self.lora_r, self.head)

    def settings(self) -> dict:
        """The config as the model card records it: ``lora_r`` resolved, ``head`` only when given (a card written
        before either existed still resumes)."""
        fields = {**asdict(self), "lora_r": self.rank}
        for name in ("head", "permute_labels", "mask_augment"):
            if not fields[name]:
                del fields[name]
        return fields

    def validate(self) -> Task:
        """Refuse bad values before any data or model is read; returns the task."""
        task = get_task(self.task)
        check_training(task_facts(task), self.loss, self.head, self.permute_labels, self.mask_augment, LOSSES, HEADS)
        if self.head is not None:
            task = head_task(task)
        check_schedule({**vars(self), "lora_r": self.rank})
        return task


def head_task(task: Task) -> Task:
    """The task a ``--head`` trains (checked by :func:`llmattr.finetuning.check_training`): a head task as is, a
    prompted one's head version (``sst2`` -> ``sst2-head``, ``stsb`` -> ``stsb-regression``)."""
    name = head_name(task_facts(task))
    if name == task.name:
        return task
    if task.numeric:
        extra = {"num_labels": 1, "lm_alternative": task.name}
        return STSB_REGRESSION if name == STSB_REGRESSION.name else replace(task, name=name, head="regression",
                                                                             extra=extra)
    return HEAD_TASKS.get(name) or head_version(task)


def read_examples(cfg: FinetuneConfig, task: Task) -> tuple[Task, list[dict], dict]:
    """The task (``--labels`` applied), all examples, and the data's description for the card."""
    if cfg.data is None:
        sample_data(task_facts(task), FINETUNE_DATA)
        examples = load_examples(task, seed=cfg.seed)
        return task, examples, {"source": task.data, "rows": len(examples)}
    task, examples = read_file_examples(task, cfg.data, cfg.text_field, cfg.label_field, cfg.labels)
    return task, examples, {"source": str(cfg.data), "rows": len(examples), "text_field": cfg.text_field,
                            "label_field": cfg.label_field, "labels": cfg.labels}


def split(task: Task, examples: list[dict], held_out: int, seed: int,
          classes: tuple[str, ...] | None = None) -> tuple[list[dict], list[dict]]:
    """(training rows, held-out rows): ``held_out`` rows balanced over ``classes`` (default: the task's classes, its
    label words; ``()`` for a regression task's numbers: a plain seeded draw), drawn with ``seed``; a training row
    never shares an id or its user text with a held-out row (duplicates in the data stay on the held-out side)."""
    held_out_rows(held_out, len(examples))
    held = sample(examples, held_out, seed, True, task.classes if classes is None else classes)
    ids = {ex["id"] for ex in held}
    texts = {content_hash(task.user_content(ex)[0]) for ex in held}
    train = [ex for ex in examples if ex["id"] not in ids and content_hash(task.user_content(ex)[0]) not in texts]
    return train, held


def permuted(rows: list[dict], seed: int) -> list[dict]:
    """``rows`` with their labels permuted by ``seed``, texts and ids kept: the training data of Adebayo et al.'s
    data randomisation test (a model that can only memorise; faithfulness/sanity.py's ``data-randomization``)."""
    labels = [row["label"] for row in rows]
    random.Random(seed).shuffle(labels)
    return [{**row, "label": label} for row, label in zip(rows, labels, strict=True)]


def cap(task: Task, example: dict, tokenizer, max_tokens: int) -> dict:
    """``example`` with each text field cut to its first ``max_tokens`` tokens (IMDb reviews run to 2,000)."""
    capped = dict(example)
    for name in task.fields:
        ids = tokenizer(str(example[name]), add_special_tokens=False)["input_ids"]
        if len(ids) > max_tokens:
            capped[name] = tokenizer.decode(ids[:max_tokens])
    return capped


def label_sequence(tokenizer, task: Task, example: dict, label_ids: torch.Tensor) -> dict:
    """The task's prompt and the token of the gold label word, the target at the prompt's last position.

    ``labels`` is ``[-100, y]``: the label follows the last prompt position as in a shifted causal-LM loss, so
    the Trainer's count of targets (``labels[..., 1:] != -100``) is one per row.
    """
    prompt = build_prompt(tokenizer, task, example)
    return {"input_ids": prompt.input_ids[0].tolist(), "span": prompt.span,
            "labels": [-100, int(label_ids[task.label_words.index(example["label"])])]}


def lm_sequence(tokenizer, task: Task, example: dict) -> dict:
    """The example's text (its fields, one paragraph each) after the BOS token; every text token is a target."""
    text = "\n\n".join(str(example[name]) for name in task.fields)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    return {"input_ids": bos + ids, "labels": [-100] * len(bos) + ids}


class MaskAugmentedBody:
    """The label rows with F-Fidelity's random-mask augmentation (Zheng et al., ICLR 2025; docs/trust.md).

    Each time row ``i`` is read in epoch ``e`` its content span (the text: never a token of the template) loses
    :func:`~llmattr.faithfulness.ffidelity.augment_mask`'s tokens (``k ~ U{0..K}``, ``K = round(beta m)``); they are
    deleted, as ``f-fidelity`` deletes them at test time, so every removal size the test makes was seen in training.
    The draw is seeded by ``(seed, e, i)``: the same on a resumed run. ``epoch`` is set by :class:`EpochCallback`
    as each epoch begins.
    """

    def __init__(self, rows: list[dict], beta: float, seed: int):
        self.rows, self.beta, self.seed, self.epoch = rows, beta, seed, 0

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        row = self.rows[i]
        gen = torch.Generator().manual_seed(stable_seed(self.seed, self.epoch, i, "mask-augment"))
        a, b = row["span"]
        removed = augment_mask(b - a, self.beta, gen)
        keep = [j for j in range(len(row["input_ids"])) if not a <= j < b or not removed[j - a]]
        return {"input_ids": [row["input_ids"][j] for j in keep], "labels": row["labels"]}


MaskAugmented = derived("MaskAugmented", MaskAugmentedBody, lambda: torch.utils.data.Dataset)


class EpochCallbackBody:
    """Tells :class:`MaskAugmented` which epoch is read (``state.epoch`` is the epochs done, fractional on a run
    resumed inside an epoch), so each epoch draws new masks."""

    def __init__(self, dataset: MaskAugmentedBody):
        self.dataset = dataset

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.dataset.epoch = int(state.epoch or 0)


EpochCallback = derived("EpochCallback", EpochCallbackBody, lambda: transformers.TrainerCallback)


@dataclass
class Collator:
    """Pads a batch of sequences; padding has attention mask 0 and label -100.

    ``left=True`` (the label loss): prompts are left-padded with explicit position ids, so every row's
    answer position is the last one and the model computes logits there only (``logits_to_keep=1``), as
    :func:`llmattr.evaluation.accuracy.label_predictions` reads them; the vocabulary projection of every other
    position (a fifth of the forward's work for SmolLM2, and the largest activation) is never computed.
    """

    pad_id: int
    left: bool = False

    def __call__(self, features: list[dict]) -> dict:
        width = max(len(f["input_ids"]) for f in features)
        def pad(seq, value, size):
            fill = [value] * (size - len(seq))
            return fill + seq if self.left else seq + fill
        mask = torch.tensor([pad([1] * len(f["input_ids"]), 0, width) for f in features])
        batch = {"input_ids": torch.tensor([pad(f["input_ids"], self.pad_id, width) for f in features]),
                 "attention_mask": mask,
                 "labels": torch.tensor([pad(f["labels"], -100, max(len(g["labels"]) for g in features))
                                         for f in features])}
        if self.left:
            batch["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0)
            batch["logits_to_keep"] = 1
        return batch


def label_loss(outputs, labels: torch.Tensor, num_items_in_batch=None) -> torch.Tensor:
    """``-sum_b log softmax(z_b)[y_b] / B``: the label word's cross-entropy at the answer position (the last)."""
    logits = outputs.logits[:, -1].float()
    total = torch.nn.functional.cross_entropy(logits, labels[:, -1].to(logits.device), reduction="sum")
    return total / (num_items_in_batch if num_items_in_batch is not None else labels.shape[0])


def head_model(lm: LoadedModel, task: Task, seed: int) -> transformers.PreTrainedModel:
    """transformers' ``*ForSequenceClassification`` on ``lm``'s base model: the base's weights, a new linear
    ``score`` head (``num_labels`` outputs, one per label word; 1 for regression, trained by MSE) drawn with
    ``seed``, reading the last non-padding token's final state as transformers' Llama classifiers do."""
    config = lm.model.config.__class__.from_dict(lm.model.config.to_dict())
    regression = task.numeric
    config.num_labels = 1 if regression else len(task.label_words)
    config.id2label = {0: "score"} if regression else dict(enumerate(task.label_words))
    config.label2id = {v: k for k, v in config.id2label.items()}
    config.problem_type = "regression" if regression else "single_label_classification"
    pad = lm.tokenizer.pad_token_id
    config.pad_token_id = pad if pad is not None else lm.tokenizer.eos_token_id
    config.architectures = None
    transformers.set_seed(seed)
    model = transformers.AutoModelForSequenceClassification.from_config(config, dtype=lm.model.dtype)
    model.base_model.load_state_dict(lm.model.base_model.state_dict())
    model.requires_grad_(False)
    return model.to(lm.device)


def head_label(task: Task, example: dict) -> float | int:
    """The head's target: the gold label word's index, or the gold number of a regression task."""
    return float(example["label"]) if task.numeric else task.label_words.index(example["label"])


def head_row(tokenizer, task: Task, example: dict) -> dict:
    """One training row of a head: what the head reads (:meth:`Task.head_input_ids`) and its target."""
    return {"input_ids": task.head_input_ids(tokenizer, example), "labels": head_label(task, example)}


@dataclass
class HeadCollator:
    """Right-pads a batch of head rows (attention mask 0, the model's ``pad_token_id``, which the head skips to find
    the last token); ``labels`` are one class index or one number per row."""

    pad_id: int

    def __call__(self, features: list[dict]) -> dict:
        width = max(len(f["input_ids"]) for f in features)
        ids = [f["input_ids"] + [self.pad_id] * (width - len(f["input_ids"])) for f in features]
        mask = [[1] * len(f["input_ids"]) + [0] * (width - len(f["input_ids"])) for f in features]
        labels = [f["labels"] for f in features]
        return {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask),
                "labels": torch.tensor(labels, dtype=torch.float32 if isinstance(labels[0], float) else torch.long)}


def head_outputs(model, tokenizer, task: Task, examples: list[dict], max_tokens: int,
                 batch_size: int = 16) -> torch.Tensor:
    """The head's outputs ``(n, num_labels)`` on ``examples`` (each text cut to ``max_tokens`` as in training)."""
    pad = model.config.pad_token_id
    collate = HeadCollator(pad if pad is not None else 0)
    device = model.get_input_embeddings().weight.device
    out = []
    with torch.no_grad():
        for i in range(0, len(examples), batch_size):
            batch = collate([head_row(tokenizer, task, cap(task, ex, tokenizer, max_tokens))
                             for ex in examples[i: i + batch_size]])
            out.append(model(input_ids=batch["input_ids"].to(device),
                             attention_mask=batch["attention_mask"].to(device)).logits.float().cpu())
    return torch.cat(out)


def held_out_head(lm: LoadedModel, task: Task, held: list[dict], train: list[dict], max_tokens: int) -> dict:
    """The head on the held-out rows. Classification: accuracy (95% BCa interval), the majority-class rate and
    the predicted counts, as :func:`held_out_accuracy`. Regression (paper 003 reads STS-B so): Pearson's r with
    the gold scores, its 95% interval (Fisher z) and p-value, the mean squared error and that of the constant
    predictor, the training rows' mean score (whose Pearson correlation is undefined)."""
    out = head_outputs(lm.model, lm.tokenizer, task, held, max_tokens)
    if not task.numeric:
        pred = out.argmax(-1).tolist()
        return class_accuracy(task, held, pred)
    pred = out[:, 0].double().numpy()
    gold = [float(ex["label"]) for ex in held]
    r = scipy_stats.pearsonr(pred, gold)
    ci = r.confidence_interval(0.95)
    mean = sum(float(ex["label"]) for ex in train) / len(train)
    return {"n": len(held), "pearson": float(r.statistic), "low": float(ci.low), "high": float(ci.high),
            "p": float(r.pvalue), "mse": float(((pred - gold) ** 2).mean()),
            "constant_mse": float(sum((g - mean) ** 2 for g in gold) / len(gold)), "constant": mean}


def check_out(out: Path, settings: dict) -> dict | None:
    """Refuse an output folder that is not this finetune's (:func:`resumable_card`; then an unfinished run's other
    settings, ``data_sha256`` among them, taken over every example's prompt by :func:`plan`); returns its card when
    it is (a run to resume)."""
    card = resumable_card(out)
    if card is None:
        return None
    if card.get("settings") != settings:
        stored = card.get("settings", {})
        diff = ", ".join(f"{k}: {stored.get(k)!r} -> {settings.get(k)!r}" for k in sorted(set(stored) | set(settings))
                         if stored.get(k) != settings.get(k))
        raise LlmattrError(f"--out {out} holds an unfinished finetune with other settings ({diff}); rerun it "
                           "with its settings to resume, or give another folder")
    return card


def write_card(out: Path, card: dict) -> None:
    """The card as JSON (written atomically) and as README.md."""
    tmp = out / (CARD_NAME + ".tmp")
    tmp.write_text(json.dumps(card, indent=1, ensure_ascii=False), encoding="utf-8")
    tmp.replace(card_path(out))
    (out / "README.md").write_text(card_markdown(card), encoding="utf-8")


def card_markdown(card: dict) -> str:
    """The model card for a person (the README of the folder)."""
    held = card.get("held_out") or {}
    hp = card["hyperparameters"]
    lines = [
        "---", "library_name: transformers", f"base_model: {card['base_model']}", "tags: [llmattr, finetune]", "---",
        "", f"# {card['task']} fine-tune of {card['base_model']}", "",
        f"Made by `llmattr finetune` (llmattr {card['llmattr']}); status: {card['status']}.", "",
        "| fact | value |", "| --- | --- |",
        f"| base model | {card['base_model']} |", f"| task | {card['task']} (loss: {card['loss']}) |",
        f"| data | {card['data']['source']} ({card['data']['rows']} rows) |",
        f"| training rows | {card['n_train']} (ids in {CARD_NAME}) |",
        f"| held-out rows | {card['n_held_out']} (never trained on) |", f"| seed | {card['seed']} |",
        "| hyper-parameters | " + ", ".join(f"{k}={v}" for k, v in hp.items()) + " |",
    ]
    if held:
        lines.append("| held-out {} | {} |".format(*held_out_summary(held)))
    if card.get("train_seconds") is not None:
        lines.append(f"| training time | {card['train_seconds'] / 60:.1f} min ({card.get('device')}; the last "
                     "session's if the run was resumed) |")
    return "\n".join(lines) + "\n\nLoad it with `llmattr explain --model DIR ...` or `llmattr evaluate --model DIR`.\n"


def held_out_accuracy(lm: LoadedModel, task: Task, held: list[dict]) -> dict:
    """Label-word argmax accuracy on the held-out rows, its 95% BCa bootstrap interval, and the majority rate."""
    return class_accuracy(task, held, label_predictions(lm, task, held).tolist())


def class_accuracy(task: Task, held: list[dict], pred: list[int]) -> dict:
    """Accuracy of predicted label indices ``pred`` on ``held``, its 95% BCa interval, the majority-class rate and
    the predicted counts per label word."""
    correct = {ex["id"]: float(task.label_words[p] == ex["label"]) for ex, p in zip(held, pred, strict=True)}
    est = estimate({task.name: correct})
    counts = {w: sum(ex["label"] == w for ex in held) for w in task.label_words}
    return {"n": est.n, "accuracy": est.mean, "low": est.low, "high": est.high,
            "majority": max(counts.values()) / len(held),
            "predicted": {w: pred.count(i) for i, w in enumerate(task.label_words)}}


def new_card(cfg: FinetuneConfig, task: Task, data: dict, settings: dict, train: list[dict],
             held: list[dict]) -> dict:
    """The model card as training starts (``status: training``); the results are added when it ends."""
    return {
        "llmattr_finetune": 1, "llmattr": __version__, "status": "training", "settings": settings,
        "base_model": settings["base_model"], "task": task.name, "loss": cfg.loss, "data": data,
        "seed": cfg.seed,
        "hyperparameters": {"epochs": cfg.epochs, "learning_rate": cfg.learning_rate, "batch_size": cfg.batch_size,
                            "optimizer": "adamw_torch", "schedule": "linear", "max_tokens": cfg.max_tokens,
                            "lora_r": cfg.rank, **({"head": cfg.head} if cfg.head else {}),
                            **({"mask_augment": cfg.mask_augment} if cfg.mask_augment else {})},
        "n_train": len(train), "n_held_out": len(held),
        "train_ids": [ex["id"] for ex in train], "held_out_ids": [ex["id"] for ex in held],
        "train_hashes": sorted({content_hash(task.user_content(ex)[0]) for ex in train}),
    }


@dataclass
class Plan:
    """What a finetune trains, checked and read before its model loads (:func:`plan`): the task (``--labels`` or
    ``--head`` applied), the training and held-out rows, the data's description and the settings of the card, and
    the card of the unfinished run it resumes (None: a new run)."""

    task: Task
    train: list[dict]
    held: list[dict]
    data: dict
    settings: dict
    resumed: dict | None


def plan(model: str | LoadedModel, out: str | Path, cfg: FinetuneConfig) -> Plan:
    """Every check of ``cfg`` that needs no model, in one order, and the rows it trains on: the settings
    (:meth:`FinetuneConfig.validate`), the data (a file's rows, columns and labels, else the task's sample data),
    the held-out split and ``out`` (an unfinished run there must have the same settings). Imports no torch:
    ``llmattr finetune`` calls it before the model loads, as :func:`finetune` does."""
    task = cfg.validate()
    task, examples, data = read_examples(cfg, task)
    train, held = (split(task, examples, cfg.held_out, cfg.seed) if held_out_split(task_facts(task), cfg.head)
                   else (examples, []))
    if cfg.permute_labels:
        train = permuted(train, cfg.seed)  # the held-out rows keep their true labels: accuracy near chance
    base = model.model_id if isinstance(model, LoadedModel) else str(model)
    data["sha256"] = content_hash(json.dumps([[ex["id"], task.user_content(ex)[0], ex.get("label")]
                                              for ex in examples]))
    settings = {"base_model": base, **cfg.settings(), "data_sha256": data["sha256"]}
    return Plan(task, train, held, data, settings, check_out(Path(out), settings))


def finetune(model: str | LoadedModel = "default", out: str | Path = "finetuned", config: FinetuneConfig | None = None,
             *, device: str = "auto", progress: bool = True, callbacks: tuple = (), planned: Plan | None = None,
             **options) -> dict:
    """Fine-tune ``model`` on ``config.task`` (or ``**options``, the config's fields) into folder ``out``.

    Returns the model card. Everything the user gave is checked before the model loads (:func:`plan`; ``planned``:
    its result where the caller has it). Interrupted, the same call resumes from the last checkpoint in
    ``out/checkpoints``; ``callbacks`` are extra Trainer callbacks.
    """
    cfg = replace(config or FinetuneConfig(), **options)
    planned = planned or plan(model, out, cfg)
    task, train, held, resumed = planned.task, planned.train, planned.held, planned.resumed
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    card = new_card(cfg, task, planned.data, planned.settings, train, held)
    if resumed is None:
        write_card(out, card)
    lm = model if isinstance(model, LoadedModel) else load_model(model, device=device, load_in_4bit=cfg.load_in_4bit)
    tokenizer = lm.tokenizer
    if cfg.head:
        lm = replace(lm, model=head_model(lm, task, cfg.seed))
        rows = [head_row(tokenizer, task, cap(task, ex, tokenizer, cfg.max_tokens)) for ex in train]
    elif cfg.loss == "label":
        label_ids = task.label_ids(tokenizer)
        rows = [label_sequence(tokenizer, task, cap(task, ex, tokenizer, cfg.max_tokens), label_ids) for ex in train]
        rows = (MaskAugmented(rows, cfg.mask_augment, cfg.seed) if cfg.mask_augment
                else [{k: v for k, v in row.items() if k != "span"} for row in rows])
    else:
        rows = [lm_sequence(tokenizer, task, cap(task, ex, tokenizer, cfg.max_tokens)) for ex in train]
    start = time.perf_counter()
    trainer = build_trainer(lm, rows, cfg, out / CHECKPOINTS, progress, callbacks)
    last = trainer_utils.get_last_checkpoint(str(out / CHECKPOINTS)) if (out / CHECKPOINTS).is_dir() else None
    trainer.train(resume_from_checkpoint=last)
    trained = trainer.model.merge_and_unload() if cfg.rank else trainer.model
    trained.eval()
    trained.requires_grad_(False)
    lm.forget()  # a loaded model given is trained in place, and a LoRA merge writes through .data (llmattr.models.kept)
    lm = replace(lm, model=trained)
    card["train_seconds"] = time.perf_counter() - start
    card["device"] = str(lm.device)
    card["base_model"] = lm.model_id
    card["loss_curve"] = [[entry["step"], entry["loss"]] for entry in trainer.state.log_history if "loss" in entry]
    trained.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if held:
        card["held_out"] = (held_out_head(lm, task, held, train, cfg.max_tokens) if cfg.head
                            else held_out_accuracy(lm, task, held))
    card["status"] = "done"
    write_card(out, card)
    shutil.rmtree(out / CHECKPOINTS, ignore_errors=True)
    return card


def build_trainer(lm: LoadedModel, rows: list[dict] | MaskAugmentedBody, cfg: FinetuneConfig, checkpoints: Path,
                  progress: bool, callbacks: tuple) -> transformers.Trainer:
    """transformers' Trainer over ``rows`` (AdamW, linear decay, no warm-up, no weight decay, no dropout change)."""
    transformers.set_seed(cfg.seed)
    model = lm.model
    if cfg.rank:  # the base stays frozen (load_model froze it); only the adapters train
        import peft

        if cfg.load_in_4bit:
            model = peft.prepare_model_for_kbit_training(model)
        # SEQ_CLS: peft keeps the head (``score``) in ``modules_to_save``: a full trainable copy, merged back
        lora = peft.LoraConfig(r=cfg.rank, lora_alpha=2 * cfg.rank, target_modules="all-linear",
                               task_type="SEQ_CLS" if cfg.head else "CAUSAL_LM")
        with warnings.catch_warnings():  # peft asks transformers' deprecated is_gradient_checkpointing: not ours
            warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
            model = peft.get_peft_model(model, lora)
    else:
        model.requires_grad_(True)
    steps = math.ceil(len(rows) / cfg.batch_size) * cfg.epochs
    args = transformers.TrainingArguments(
        output_dir=str(checkpoints), num_train_epochs=cfg.epochs, learning_rate=cfg.learning_rate,
        per_device_train_batch_size=cfg.batch_size, seed=cfg.seed, data_seed=cfg.seed,
        use_cpu=lm.device.type == "cpu", save_strategy="steps", save_steps=min(cfg.save_steps, steps),
        save_total_limit=1, logging_steps=cfg.logging_steps, logging_first_step=True, report_to="none",
        disable_tqdm=not progress, remove_unused_columns=False, train_sampling_strategy="group_by_length",
        weight_decay=0.0, lr_scheduler_type="linear", warmup_steps=0, dataloader_num_workers=0,
    )
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else lm.tokenizer.eos_token_id
    label = cfg.loss == "label" and not cfg.head  # a head's own loss: cross-entropy, or MSE for regression
    if isinstance(rows, MaskAugmented):
        callbacks = (EpochCallback(rows), *callbacks)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=rows, callbacks=list(callbacks),
                                   data_collator=HeadCollator(pad or 0) if cfg.head else Collator(pad or 0, left=label),
                                   compute_loss_func=label_loss if label else None)
    if not progress:
        trainer.remove_callback(transformers.PrinterCallback)
    return trainer


FINETUNE_DATA = "--data FILE"  # what a finetune without sample data is given instead


HEAD_LORA_R = 4  # paper 003 sec. 4.1: LLaMA-2 fine-tuned with LoRA of rank 4 (PEFT)


def training_loss(loss: str, objective: str | None, label_loss: str) -> str:
    """A finetune's loss: ``loss``, or ``objective`` (its name before issue 39) where given, refused beside a
    ``loss`` other than the default ``label_loss``."""
    if objective is None:
        return loss
    if loss not in (label_loss, objective):
        raise LlmattrError("finetune takes --loss (or its old name --objective), not both")
    return objective


def check_training(task: Mapping, loss: str, head: str | None, permute_labels: bool, mask_augment: float,
                   losses: Sequence[str], heads: Sequence[str]) -> None:
    """Refuse a finetune whose ``loss`` (one of ``losses``, the first the label loss), ``head`` (one of ``heads``, or
    None: the LM head), label permutation or mask augmentation does not fit the task (``task``:
    :func:`task_facts`)."""
    one_of(loss, losses, "--loss")
    if head is not None:
        one_of(head, heads, "--head")
        if loss != losses[0]:
            raise LlmattrError(f"--head {head} trains the head on the labels; --loss {loss} is for the LM head")
        wanted = "regression" if task["numeric"] else "classification" if task["classifies"] else None
        if wanted is None:
            raise LlmattrError(f"--head {head} needs a classification or regression task; {task['name']} is a "
                               f"{task['kind']} task")
        if head != wanted:
            raise LlmattrError(f"task {task['name']} is {article(task['kind'])} task: give --head {wanted}, not --head "
                               f"{head}")
    elif task["head"] != "lm":
        raise LlmattrError(f"task {task['name']} is read by a sequence-{task['head']} head: give --head "
                           f"{task['head']}")
    elif loss == "label" and not task["classifies"]:
        regression = (" (paper 003's regression head: --task stsb-regression --head regression)"
                      if task["numeric"] else "")
        raise LlmattrError(f"finetune --loss label needs a classification task with label words; {task['name']} "
                           f"is {article(task['kind'])} task{regression}; use --loss lm to fine-tune on its text")
    if permute_labels and not (head or loss == "label"):
        raise LlmattrError("--permute-labels permutes the labels a model learns: give --loss label or --head")
    mask_rate(mask_augment, "--mask-augment")
    if mask_augment and (head or loss != "label"):
        raise LlmattrError("--mask-augment deletes text tokens of the task's prompt: it trains with --loss label, "
                           "without --head")


def lora_rank(lora_r: int | None, head: str | None) -> int:
    """The LoRA rank a finetune trains: ``lora_r``, or by default 4 with a ``head`` (paper 003's recipe) and 0 (full
    fine-tuning) without."""
    if lora_r is not None:
        return lora_r
    return HEAD_LORA_R if head else 0


def check_schedule(settings: Mapping) -> None:
    """Refuse a finetune's counts (held-out rows, epochs, batch size, tokens, steps: those in ``settings``, each a
    whole number >= 1), learning rate, LoRA rank (``lora_r``, resolved: :func:`lora_rank`) and 4-bit loading where
    they cannot train, or need a package that is not installed."""
    for name in ("held_out", "epochs", "batch_size", "max_tokens", "save_steps", "logging_steps"):
        if name in settings:
            positive_int(settings[name], f"--{name.replace('_', '-')}")
    learning_rate, rank = settings["learning_rate"], settings["lora_r"]
    if not (isinstance(learning_rate, float | int) and 0 < learning_rate < 1):
        raise LlmattrError(f"--learning-rate must be in (0, 1), got {learning_rate!r}")
    if rank < 0:
        raise LlmattrError(f"--lora-r must be 0 (full fine-tuning) or a rank >= 1, got {rank}")
    if rank and importlib.util.find_spec("peft") is None:
        raise LlmattrError("--lora-r needs peft: pip install 'llmattr[finetune]'")
    if settings.get("load_in_4bit") and importlib.util.find_spec("bitsandbytes") is None:
        raise LlmattrError("--load-in-4bit needs bitsandbytes (a CUDA GPU): pip install 'llmattr[quant]'")
    if settings.get("load_in_4bit") and not rank:
        raise LlmattrError("--load-in-4bit trains LoRA adapters on the frozen 4-bit weights: give --lora-r")


def head_name(task: Mapping) -> str:
    """The task ``finetune --head`` trains for ``task`` (:func:`task_facts`), by name: a head task itself, a
    regression task's ``NAME-regression`` (``stsb-regression``), a classification task's ``NAME-head``."""
    if task["head"] != "lm":
        return task["name"]
    return f"{task['name']}-{'regression' if task['numeric'] else 'head'}"


def held_out_split(task: Mapping, head: str | None) -> bool:
    """Whether a finetune of ``task`` (:func:`task_facts`; the head task with a ``head``) keeps rows out to measure
    the model on: a head's (its accuracy or Pearson r), or a classification task's label-word accuracy; a task
    without classes trained on its texts (``--loss lm``: WikiBio, STS-B's prompted scores) trains on every row."""
    return bool(head) or task["classifies"]


def held_out_rows(held_out: int, rows: int) -> int:
    """``--held-out``: the rows of ``rows`` kept out of training, refused when none would be left to train on."""
    if held_out >= rows:
        raise LlmattrError(f"--held-out {held_out} leaves no training rows of {rows}")
    return held_out


def out_folder(out: Path) -> None:
    """Refuse finetune's ``--out`` where it is a file (its folder's contents are checked against the run later)."""
    if out.exists() and not out.is_dir():
        raise LlmattrError(f"--out {out} is a file; give a folder")


def resumable_card(out: Path) -> dict | None:
    """The card of finetune's ``--out`` folder where it holds an unfinished finetune (a run to resume, if its
    settings are this run's), None for a new or empty folder; refused in one line when ``out`` is a file
    (:func:`out_folder`), holds something else, or holds a finished finetune."""
    out_folder(out)
    if not out.exists():
        return None
    card = read_card(out)
    if card is None:
        if any(out.iterdir()):
            raise LlmattrError(f"--out {out} exists and is not a llmattr finetune's folder (no {CARD_NAME}); "
                               "give a new or empty folder")
        return None
    if card.get("status") == "done":
        raise LlmattrError(f"--out {out} holds a finished finetune ({card.get('task')}, held-out accuracy "
                           f"{card.get('held_out', {}).get('accuracy')}); give another folder")
    return card


__all__ = ["FinetuneConfig", "Plan", "finetune", "plan", "split", "LOSSES"]
