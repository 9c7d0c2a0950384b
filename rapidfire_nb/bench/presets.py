"""The bench's presets and what each side trains: the base model, the datasets, the config group."""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass



LEARNING_RATES = [1e-3, 5e-4, 2e-4, 1e-4, 5e-5, 2e-5, 1e-5, 5e-6]


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int | None           # None: the demo tokenizer's vocabulary
    dtype: str                  # "float32" | "bfloat16"
    device: str                 # "cpu" | "cuda"
    batch: int
    seq_len: int | None         # None: the short demo prompt/completion data, padded per batch
    steps_per_chunk: int
    num_chunks: int
    n_configs: int
    lora_r: int
    lora_targets: tuple[str, ...]
    n_eval: int
    threads: int | None = None  # torch intra-op threads (None: torch's default; --threads wins)
    eval: bool = True           # the preset's --eval default (both sides evaluate, or neither)

    @property
    def steps_per_run(self) -> int:
        return self.steps_per_chunk * self.num_chunks

    @property
    def n_train(self) -> int:
        # one epoch is exactly num_chunks chunks of steps_per_chunk optimizer steps
        return self.steps_per_run * self.batch


PRESETS: dict[str, Preset] = {
    "cpu": Preset(
        name="cpu", description="Llama architecture, ~4.5M params (hidden 256, 4 layers), fp32, CPU",
        hidden=256, layers=4, heads=4, kv_heads=4, intermediate=1024, vocab=None, dtype="float32",
        device="cpu", batch=8, seq_len=None, steps_per_chunk=8, num_chunks=4, n_configs=4,
        lora_r=8, lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"), n_eval=32),
    "tinyllama": Preset(
        name="tinyllama", description="TinyLlama-1.1B-shaped (hidden 2048, 22 layers, GQA 32/4, "
                                      "vocab 32000), random init, bf16, CUDA",
        hidden=2048, layers=22, heads=32, kv_heads=4, intermediate=5632, vocab=32000,
        dtype="bfloat16", device="cuda", batch=4, seq_len=512, steps_per_chunk=8, num_chunks=8,
        n_configs=4, lora_r=16, lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"), n_eval=16),
    # rapidfire bench --vs on a GPU (the GPU check): the tinyllama shape at 256 tokens, eight chunks
    # of two steps, so the rungs fall at 1, 2, 4, 8 chunks as on the cpu preset; minutes, not ten
    "vs": Preset(
        name="vs", description="TinyLlama-1.1B-shaped, 256 tokens, random init, bf16, CUDA; "
                               "for --vs (8 chunks x 2 steps per config)",
        hidden=2048, layers=22, heads=32, kv_heads=4, intermediate=5632, vocab=32000,
        dtype="bfloat16", device="cuda", batch=4, seq_len=256, steps_per_chunk=2, num_chunks=8,
        n_configs=8, lora_r=16, lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"), n_eval=8),
    # the GPU's launch-bound regime on a CPU: a step of this narrow, deep model is mostly host work
    # (Python, op dispatch) rather than arithmetic, as a 1.1B LoRA step is on an H100, so work on
    # another thread that holds the interpreter costs step time directly; 16 chunks of 2 steps
    # make a chunk boundary (snapshot, checkpoint write) every other step, eval off
    "launch": Preset(
        name="launch", description="launch-bound: Llama hidden 64, 22 layers, fp32, CPU, 1 thread, "
                                   "16 chunks x 2 steps, eval off (a step is mostly host work)",
        hidden=64, layers=22, heads=4, kv_heads=4, intermediate=256, vocab=None, dtype="float32",
        device="cpu", batch=4, seq_len=None, steps_per_chunk=2, num_chunks=16, n_configs=4,
        lora_r=16, lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"), n_eval=8,
        threads=1, eval=False),
    "smoke": Preset(
        name="smoke", description="seconds-long run of the bench machinery (numbers mean nothing)",
        hidden=32, layers=2, heads=4, kv_heads=4, intermediate=64, vocab=None, dtype="float32",
        device="cpu", batch=4, seq_len=None, steps_per_chunk=2, num_chunks=2, n_configs=2,
        lora_r=4, lora_targets=("q_proj", "v_proj"), n_eval=8),
}


def _torch_dtype(name: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def build_base(p: Preset):
    """The shared base model (random init, seeded) on the preset's device, and its tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from rapidfire_nb import demo_data

    tok = demo_data.make_tokenizer()
    if p.seq_len:
        tok.model_max_length = max(tok.model_max_length, p.seq_len)
    config = LlamaConfig(
        vocab_size=p.vocab or len(tok), hidden_size=p.hidden, intermediate_size=p.intermediate,
        num_hidden_layers=p.layers, num_attention_heads=p.heads, num_key_value_heads=p.kv_heads,
        max_position_embeddings=max(512, p.seq_len or 0), pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=False)
    saved = torch.random.get_rng_state()
    torch.manual_seed(0)
    try:
        # build directly on the device in the target dtype: a 1.1B fp32 CPU init takes minutes
        with torch.device(p.device):
            model = LlamaForCausalLM(config).to(_torch_dtype(p.dtype))
    finally:
        torch.random.set_rng_state(saved)
    model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok


def make_datasets(p: Preset, n_train: int | None = None):
    """Train/eval sets sized so one epoch is exactly ``num_chunks`` chunks of the preset."""
    import random

    from datasets import Dataset

    from rapidfire_nb import demo_data

    n_train = n_train or p.n_train
    if p.seq_len is None:
        return demo_data.make_demo_datasets(n_train, p.n_eval, seed=0)
    words = demo_data.WORDS + demo_data.ANIMALS + demo_data.COLORS
    rng = random.Random(0)

    def rows(n):
        # ~2 tokens per word: 400 words always exceed seq_len tokens, so truncation makes every
        # sequence exactly seq_len long (a fixed batch shape, as in the "4 x 512 tokens")
        return [{"text": " ".join(rng.choice(words) for _ in range(p.seq_len))} for _ in range(n)]

    return Dataset.from_list(rows(n_train)), Dataset.from_list(rows(p.n_eval))


def training_kwargs(p: Preset) -> dict:
    kw = dict(per_device_train_batch_size=p.batch, per_device_eval_batch_size=p.batch,
              gradient_accumulation_steps=1, num_train_epochs=1, lr_scheduler_type="linear",
              warmup_steps=0, gradient_checkpointing=False, dataloader_num_workers=0,
              bf16=p.dtype == "bfloat16", fp16=p.dtype == "float16")
    if p.device == "cpu":
        kw["use_cpu"] = True
    if p.seq_len:
        kw["max_length"] = p.seq_len
    return kw


def make_group(p: Preset, n_configs: int):
    """N LoRA configs on one base, differing only in learning rate (identical compute per run)."""
    from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig

    if not 1 <= n_configs <= len(LEARNING_RATES):
        raise ValueError(f"--configs must be between 1 and {len(LEARNING_RATES)}, got {n_configs}")
    lrs = LEARNING_RATES[:n_configs]
    lr = List(lrs) if n_configs > 1 else lrs[0]
    cfg = RFModelConfig(
        model_name=f"bench-{p.name}",
        peft_config=RFLoraConfig(r=p.lora_r, lora_alpha=2 * p.lora_r, lora_dropout=0.0,
                                 target_modules=list(p.lora_targets)),
        training_args=RFSFTConfig(learning_rate=lr, **training_kwargs(p)))
    return RFGridSearch(cfg, trainer_type="SFT")


@contextlib.contextmanager
def _quiet():
    """Library progress bars and deprecation chatter off (the report is what the user reads)."""
    import datasets
    import transformers

    was_bar = datasets.utils.logging.is_progress_bar_enabled()
    datasets.disable_progress_bar()
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            transformers.logging.set_verbosity(verbosity)
            if was_bar:
                datasets.enable_progress_bar()


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def with_overrides(preset, args, fields: dict[str, str]):
    """``preset`` with the command line's sizes (``fields``: argument name -> preset field) and
    ``--device`` put in; a size below 1 raises ``ValueError`` naming the option."""
    from dataclasses import replace

    changes = {}
    for name, key in fields.items():
        value = getattr(args, name)
        if value is not None:
            if value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
            changes[key] = value
    if args.device:
        changes["device"] = args.device
    return replace(preset, **changes)
