"""The training loop: AdamW, warm-up + cosine, clipping, accumulation, bf16 autocast, DDP, exact resume.

Runs as one process (CPU or one GPU) or under `torchrun` (DistributedDataParallel over gloo on CPU,
NCCL on GPUs). Rank 0 writes checkpoints: the full training state (safetensors + JSON, atomic) in
OUT/train_state and the current drafter in the published format in OUT.
"""

from __future__ import annotations

import copy
import hashlib
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from tqdm import tqdm

from dflash_core.decode.loop import generate
from dflash_core.model.draft_vocab import DEFAULT_COVERAGE, choose_draft_vocab, count_tokens, save_draft_vocab
from dflash_core.model.drafter import Drafter
from dflash_core.model.checkpoint import check_weight_values
from dflash_core.errors import CheckpointError, ConfigError
from dflash_core.loading import stop_token_ids
from dflash_core.target.pairing import mask_token_for_training
from dflash_core.target.prompts import encode_prompt
from dflash_core.target.adapter import TargetModel
from dflash_core.target.pieces import TargetPieces
from dflash_core.training.batches import make_batch, micro_positions, sample_index
from dflash_core.training.features import FeatureCache
from dflash_core.training.train_state import STATE_FILE, has_training_state, load_training_state, save_training_state
from dflash_core.training.data import TokenDataset, data_fingerprint
from dflash_core.training.init_from_target import init_from_target
from dflash_core.training.grow import grow_from_drafter
from dflash_core.training.warm_start import init_from_drafter
from dflash_core.training.objective import TrainingObjective
from dflash_core.training.recipe import TrainConfig, drafter_config_for
from dflash_core.training.schedule import warmup_cosine

STATE_DIR = "train_state"


@dataclass
class RunOptions:
    """Knobs that do not change the math (may differ on resume)."""

    out: Path
    checkpoint_every: int = 100
    eval_every: int = 0
    eval_prompts: list[str] = field(default_factory=list)
    eval_max_new_tokens: int = 64
    save_dtype: str = "bf16"
    progress: bool = True
    # share of the data's response tokens the drafter's read-out list covers (`draft_vocab.json` beside the
    # weights, `dflash_core.model.draft_vocab`); None: no list, drafts are read out over the whole vocabulary
    draft_vocab_coverage: float | None = DEFAULT_COVERAGE


@dataclass
class Distributed:
    rank: int = 0
    world: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed(device: str = "cpu") -> Distributed:
    """Join the process group torchrun set up (gloo on CPU, NCCL on CUDA); a no-op for one process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Distributed(device=torch.device(device))
    cuda = device.startswith("cuda")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if cuda else "gloo")
    dev = torch.device(f"cuda:{local}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    return Distributed(rank=dist.get_rank(), world=dist.get_world_size(), device=dev)


class Trainer:
    """One training run. `features` (a `FeatureCache` of `data`): a step reads the target's features from it
    instead of running the target, which may then be `TargetPieces` (its embedding and LM head alone)."""

    def __init__(self, target: TargetModel, tokenizer, data: TokenDataset, train: TrainConfig, options: RunOptions,
                 place: Distributed, features: FeatureCache | None = None) -> None:
        self.target, self.data, self.train, self.options, self.place = target, data, train, options, place
        self.tokenizer, self.features = tokenizer, features
        data.check_vocabulary(target.vocab_size)
        _check_feature_source(target, train, options, features)
        target.model.requires_grad_(False)
        self.mask_id = mask_token_for_training(tokenizer, target, train.mask_token)
        self.drafter = Drafter(drafter_config_for(target, self.mask_id, train)).to(place.device)
        self.drafter.reset_parameters(train.init_std, torch.Generator().manual_seed(train.seed))
        if train.init_from_target:
            init_from_target(self.drafter, target)
        if train.init_from is not None:
            init_from_drafter(self.drafter, train.init_from)
        if train.grow_from is not None:
            grow_from_drafter(self.drafter, train.grow_from)
        self.drafter.requires_grad_(True).train()
        target.set_layer_ids(self.drafter.config.target_layer_ids)
        if features is not None:
            features.columns(self.drafter.config.target_layer_ids)  # the cache holds them, or one line
        self.draft_vocab = None  # (ids, coverage): the read-out list, also used by the periodic evaluation
        if options.draft_vocab_coverage is not None:
            responses = (s.tokens[s.prompt_length:] for s in data.samples)
            self.draft_vocab = choose_draft_vocab(count_tokens(responses, target.vocab_size),
                                                  options.draft_vocab_coverage)
            self.drafter.draft_vocab = self.draft_vocab[0]
        over_list = train.loss_vocab == "list"
        if over_list and self.draft_vocab is None:
            raise ConfigError("training setting 'loss_vocab' is 'list' but the run writes no read-out list: expected "
                              "a draft vocabulary coverage (not --no-draft-vocab).")
        self.drafter.sample_over_list = over_list  # its logits outside the list are never trained
        self.objective = TrainingObjective(self.drafter, target, train.loss_gamma, train.soft_weight,
                                           train.distill_temperature, self.draft_vocab[0] if over_list else None)
        self.model = self.objective
        if place.world > 1:
            self.model = torch.nn.parallel.DistributedDataParallel(self.objective)
        self.optimizer = torch.optim.AdamW(self.drafter.parameters(), lr=train.learning_rate, betas=(0.9, 0.95),
                                           weight_decay=train.weight_decay)
        self.global_batch = train.batch_size * train.grad_accum * place.world
        epochs_steps = math.ceil(len(data) * train.epochs / self.global_batch)
        self.total_steps = train.max_steps or max(1, epochs_steps)
        self.warmup = int(train.warmup_ratio * self.total_steps)
        self.state_dir = options.out / STATE_DIR
        self.step = 0
        self.history: list[float] = []
        self.tau_history: list[tuple[int, float]] = []
        self.autocast = train.bf16 and place.device.type in ("cpu", "cuda")
        self.timings = {"target_s": 0.0, "step_s": 0.0, "feature_tokens": 0}  # store-vs-recompute evidence

    # ---- resume ----------------------------------------------------------------------------------
    def resume_if_possible(self) -> bool:
        if not has_training_state(self.state_dir):
            return False
        weights, meta = load_training_state(self.state_dir, self.optimizer)
        if not (isinstance(meta.get("train"), dict) and isinstance(meta.get("step"), int)
                and isinstance(meta.get("history"), list)):
            raise CheckpointError(f"{self.state_dir / STATE_FILE} lacks meta.step, meta.train or meta.history, "
                                  "expected the state.json `dflash train` writes.")
        differ = self.train.differences(meta["train"])
        if meta.get("drafter") != self.drafter.config.to_dict():
            differ.append("drafter config")
        if meta.get("data") != data_fingerprint(self.data):
            differ.append("data")
        if differ:
            raise ConfigError(
                f"cannot resume from {self.state_dir}: the saved run differs in {', '.join(differ)}; "
                "use the same settings or another --out."
            )
        try:
            self.drafter.load_state_dict(check_weight_values(weights, str(self.state_dir)))
        except RuntimeError as exc:  # names or shapes that the saved drafter config promised otherwise
            raise CheckpointError(f"{self.state_dir}/model.safetensors does not fit the saved drafter config "
                                  f"({str(exc).splitlines()[0]}).") from None
        self.step = meta["step"]
        self.history = meta["history"]
        self.tau_history = [tuple(t) for t in meta.get("tau_history", [])]
        return True

    # ---- one optimizer step ------------------------------------------------------------------------
    def _micro_batch(self, micro: int):
        positions = micro_positions(self.step, micro, self.place.rank, self.train.batch_size, self.train.grad_accum,
                                    self.place.world)
        batch = make_batch(self.data, positions, anchors=self.train.anchors, block_size=self.train.block_size,
                           max_length=self.train.max_length, seed=self.train.seed)
        return _to_device(batch, self.place.device), positions

    def _target_outputs(self, batch, positions: range):
        """(features [B, T, n*H], the target's final hidden states [B, T, H] for soft labels, else None): read from
        the feature cache, or from a no-grad target forward (stopped after the last feature layer for hard labels)."""
        if self.features is not None:
            samples = [sample_index(p, len(self.data), self.train.seed) for p in positions]
            lengths = batch.valid.sum(dim=1).tolist()
            features = self.features.batch(samples, lengths, self.drafter.config.target_layer_ids)
            return features.to(self.place.device), None
        with torch.no_grad():  # target features recomputed (`dflash features` stores them instead)
            ids = torch.arange(batch.tokens.shape[1], device=batch.tokens.device).expand_as(batch.tokens)
            if self.train.soft_weight > 0:  # soft labels reuse this forward's final hidden states
                out = self.target(batch.tokens, ids, None, batch.valid.long())
                return out.features, out.hidden
            return self.target.features(batch.tokens, ids, batch.valid.long()), None

    def train_step(self) -> dict:
        lr = warmup_cosine(self.step, self.total_steps, self.warmup, self.train.learning_rate,
                           self.train.min_lr_ratio)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        totals = {"loss": 0.0, "tau_est": 0.0, "acc1": 0.0}
        step_started = time.perf_counter()
        for micro in range(self.train.grad_accum):
            batch, positions = self._micro_batch(micro)
            started = time.perf_counter()
            features, teacher = self._target_outputs(batch, positions)
            self.timings["feature_tokens"] += int(batch.valid.sum())  # a host read: on a GPU, waits for the forward
            self.timings["target_s"] += time.perf_counter() - started
            if not self.autocast:
                features = features.float()
                teacher = teacher.float() if teacher is not None else None
            sync = micro == self.train.grad_accum - 1 or self.place.world == 1
            with _maybe_no_sync(self.model, sync), torch.autocast(self.place.device.type, dtype=torch.bfloat16,
                                                                  enabled=self.autocast):
                loss, stats = self.model(features, batch, teacher)
                (loss / self.train.grad_accum).backward()
            for key in totals:
                totals[key] += (loss.item() if key == "loss" else stats[key]) / self.train.grad_accum
        if not math.isfinite(totals["loss"]):
            raise ConfigError(f"training loss became {totals['loss']} at step {self.step}: expected a finite loss; "
                              "lower --lr or --clip (the last checkpoint in --out is kept).")
        torch.nn.utils.clip_grad_norm_(self.drafter.parameters(), self.train.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.history.append(totals["loss"])
        self.timings["step_s"] += time.perf_counter() - step_started
        return totals | {"lr": lr}

    # ---- the run -----------------------------------------------------------------------------------
    def run(self) -> dict:
        self.resume_if_possible()
        bar = tqdm(total=self.total_steps, initial=self.step, desc="train drafter", dynamic_ncols=True,
                   disable=not (self.options.progress and self.place.main))
        ema: dict[str, float] = {}
        while self.step < self.total_steps:
            stats = self.train_step()
            for key in ("loss", "tau_est"):
                ema[key] = stats[key] if key not in ema else 0.9 * ema[key] + 0.1 * stats[key]
            postfix = {"loss": f"{ema['loss']:.3f}", "accept~": f"{ema['tau_est']:.2f}", "lr": f"{stats['lr']:.1e}"}
            if self.options.eval_every and self.step % self.options.eval_every == 0:
                postfix["tau"] = f"{self.evaluate():.2f}"
            bar.set_postfix(postfix)
            bar.update(1)
            if self.step % self.options.checkpoint_every == 0 and self.step < self.total_steps:
                self.checkpoint()
        bar.close()
        replicas = self.check_replicas()
        final_tau = self.evaluate() if self.options.eval_prompts else None
        self.checkpoint()
        return {"steps": self.step, "history": self.history, "tau": final_tau, "tau_history": self.tau_history,
                "replicas_identical": replicas, "timings": dict(self.timings)}

    def checkpoint(self) -> None:
        if self.place.main:
            meta = {"step": self.step, "train": self.train.to_dict(), "drafter": self.drafter.config.to_dict(),
                    "data": data_fingerprint(self.data), "history": self.history, "tau_history": self.tau_history,
                    "world_size": self.place.world}
            save_training_state(self.state_dir, dict(self.drafter.state_dict()), self.optimizer, meta)
            self.drafter.save_pretrained(self.options.out, dtype=self.options.save_dtype)  # with the list, if any
            if self.draft_vocab is not None:  # the same ids, with their coverage and source
                save_draft_vocab(self.options.out, *self.draft_vocab,
                                 source=f"the most frequent response tokens of the training data {self.data.path}",
                                 sampled_over_list=self.drafter.sample_over_list)
        if self.place.world > 1:
            dist.barrier()

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean acceptance length of the real decoder (greedy, whole block verified) on the held-out prompts."""
        tau = float("nan")
        if self.place.main and self.options.eval_prompts:
            drafter = copy.deepcopy(self.drafter).to(self.target.dtype).eval()
            stops = stop_token_ids(self.target, self.tokenizer)  # eos and a chat template's end of turn
            lengths = []
            for prompt in self.options.eval_prompts:
                ids = encode_prompt(self.tokenizer, prompt)[:, -512:]  # plain text or a chat
                # the whole block verified every step as a chain: tau measures the drafter, not the machine's
                # cost-aware draft-length policy (which would mix in plain steps) or a token tree
                result = generate(self.target, drafter, ids.to(self.place.device),
                                  max_new_tokens=self.options.eval_max_new_tokens,
                                  draft_length=drafter.config.block_size - 1, stop_token_ids=stops, tree="off")
                lengths.extend(result.acceptance_lengths[0])
            tau = sum(lengths) / max(1, len(lengths))
            self.tau_history.append((self.step, tau))
            self.drafter.train()
        if self.place.world > 1:
            dist.barrier()
        return tau

    def check_replicas(self) -> bool | None:
        """Under DDP, every rank's drafter must be bit-identical: compare parameter digests."""
        if self.place.world == 1:
            return None
        digest = hashlib.sha256()
        for p in self.drafter.parameters():
            digest.update(p.detach().cpu().float().numpy().tobytes())
        mine = torch.tensor(list(digest.digest()[:16]), dtype=torch.int64, device=self.place.device)
        everyone = [torch.zeros_like(mine) for _ in range(self.place.world)]
        dist.all_gather(everyone, mine)
        same = all(torch.equal(everyone[0], other) for other in everyone)
        if not same:
            raise RuntimeError("DDP replicas diverged: drafter parameters differ across ranks")
        return same


class _maybe_no_sync:
    """`DistributedDataParallel.no_sync()` on accumulation micro-batches, nothing otherwise."""

    def __init__(self, model, sync: bool) -> None:
        self.context = None if sync or not hasattr(model, "no_sync") else model.no_sync()

    def __enter__(self):
        return self.context.__enter__() if self.context else None

    def __exit__(self, *exc):
        return self.context.__exit__(*exc) if self.context else False


def _check_feature_source(target: TargetModel, train: TrainConfig, options: RunOptions,
                          features: FeatureCache | None) -> None:
    """Refuse (one line) what a run from stored features, or with the target's pieces alone, cannot do."""
    if features is not None and train.soft_weight > 0:
        raise ConfigError(f"training setting 'distill' is {train.distill!r} but feature cache {features.path} holds "
                          "no final hidden states for soft labels: expected distill 'hard' (or train from the live "
                          "target).")
    if isinstance(target, TargetPieces) and features is None:
        raise ConfigError("the target was loaded without its layers (embedding and LM head only): expected a feature "
                          "cache to train from, or the whole target.")
    if isinstance(target, TargetPieces) and (train.init_from_target or options.eval_prompts):
        what = "init_from_target copies its layers" if train.init_from_target else "evaluation prompts decode with it"
        raise ConfigError(f"the target was loaded without its layers (embedding and LM head only), but {what}: "
                          "expected the whole target for that.")


def _to_device(batch, device: torch.device):
    for name, value in vars(batch).items():
        setattr(batch, name, value.to(device))
    return batch


def load_data(path: str | Path | list[str | Path]) -> TokenDataset:
    """A `dflash data` directory, or several of them joined in order (`TokenDataset.joined`)."""
    paths = path if isinstance(path, list) else [path]
    parts = [TokenDataset(p) for p in paths]  # each refuses a directory without samples
    return parts[0] if len(parts) == 1 else TokenDataset.joined(parts)
