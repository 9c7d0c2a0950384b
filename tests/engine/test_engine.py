"""The chunk-interleaved engine with the real SFTTrainer on a tiny model (CPU): fair interleaving,
isolation, checkpoints and export, and runs that train whatever ran before them in the kernel."""

import pytest
import torch

from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.demo_data import make_demo_datasets, make_tiny_model_and_tokenizer, tiny_create_model
from rapidfire_nb.errors import ConfigError

SMALL = ["q_proj", "v_proj"]
BIG = ["q_proj", "k_proj", "v_proj", "o_proj"]


def sft_args(lr, **kw):
    base = dict(learning_rate=lr, per_device_train_batch_size=8, num_train_epochs=1,
                lr_scheduler_type="linear", warmup_steps=2, bf16=False, max_length=64)
    base.update(kw)
    return RFSFTConfig(**base)


def four_configs():
    loras = List([RFLoraConfig(r=8, target_modules=SMALL, lora_dropout=0.1),
                  RFLoraConfig(r=4, target_modules=BIG, lora_dropout=0.1)])
    return List([RFModelConfig(model_name="tiny", peft_config=loras, training_args=sft_args(lr))
                 for lr in (1e-3, 1e-2)])


def one_config():
    return RFModelConfig(model_name="tiny", peft_config=RFLoraConfig(r=8, target_modules=SMALL, lora_dropout=0.1),
                         training_args=sft_args(1e-2))


def counting_create_model():
    calls = []

    def create(cfg):
        calls.append(cfg)
        return tiny_create_model(cfg)

    return create, calls


def renamed(weights, run_id):
    out = {}
    for k, v in weights.items():
        parts = k.split(".")
        out[".".join("run_X" if p.startswith("run_") and parts[i - 1] in ("lora_A", "lora_B") else p
                     for i, p in enumerate(parts))] = v
    return out


def train_losses(exp, run_id):
    df = exp.get_results()
    sel = df[(df.run_id == run_id) & (df.split == "train") & (df.metric == "loss")]
    return list(zip(sel.step, sel.value))


@pytest.fixture(scope="module")
def four_run_experiment(tmp_path_factory, tiny_data):
    train, evald = tiny_data
    create, calls = counting_create_model()
    exp = Experiment("four", experiment_path=tmp_path_factory.mktemp("e"))
    exp.run_fit(RFGridSearch(four_configs(), trainer_type="SFT"), create, train, evald, num_chunks=4, seed=7)
    yield exp, calls
    exp.end()


def test_all_runs_complete_with_eval_after_every_chunk(four_run_experiment):
    exp, calls = four_run_experiment
    info = exp.get_runs_info()
    assert list(info.run_id) == [1, 2, 3, 4]
    assert set(info.status) == {"completed"}
    assert (info.completed_steps == info.total_steps).all()
    assert len(calls) == 1, "create_model must be called once for runs sharing one base"
    res = exp.get_results()
    evals = res[(res.split == "eval") & (res.metric == "eval_loss")]
    for rid in range(1, 5):
        assert list(evals[evals.run_id == rid].chunk) == [0, 1, 2, 3]
    # every run is evaluated at the same samples-seen points
    points = {rid: list(evals[evals.run_id == rid].samples_seen) for rid in range(1, 5)}
    assert len({tuple(p) for p in points.values()}) == 1
    # the runs learned differently
    finals = evals.groupby("run_id").value.last()
    assert finals.nunique() == 4


def test_fair_interleaving_from_timeline(four_run_experiment):
    exp, _ = four_run_experiment
    tl = exp.get_timeline().sort_values("start")
    finished = {}
    for row in tl.itertuples():
        k = row.epoch * 100 + row.chunk
        for other, done in finished.items():
            if other != row.run_id:
                assert done >= k, f"run {row.run_id} started chunk {k} before run {other} finished it"
        finished[row.run_id] = k + 1
        assert row.end >= row.start
        assert row.train_s > 0 and row.swap_s >= 0 and row.other_s >= 0
    assert len(tl) == 16


def test_isolation_bit_identical_to_training_alone(four_run_experiment, tiny_data, tmp_path):
    exp, _ = four_run_experiment
    train, evald = tiny_data
    # run 3 = lr 1e-2, r=8 on q,v; train that config alone
    alone = Experiment("alone", experiment_path=tmp_path)
    alone.run_fit(RFGridSearch(one_config(), trainer_type="SFT"), tiny_create_model, train, evald,
                  num_chunks=4, seed=7)
    w_multi, w_alone = renamed(exp.engine.run_weights(3), 3), renamed(alone.engine.run_weights(1), 1)
    assert w_multi.keys() == w_alone.keys() and len(w_multi) > 0
    for k in w_multi:
        assert torch.equal(w_multi[k], w_alone[k]), k
    assert train_losses(exp, 3) == train_losses(alone, 1)
    alone.end()


def test_num_chunks_does_not_change_the_result(tiny_data, tmp_path):
    train, evald = tiny_data
    results = []
    for chunks in (1, 4):
        e = Experiment(f"c{chunks}", experiment_path=tmp_path)
        e.run_fit(RFGridSearch(one_config(), trainer_type="SFT"), tiny_create_model, train, evald,
                  num_chunks=chunks, seed=3)
        results.append((e.engine.run_weights(1), train_losses(e, 1)))
        e.end()
    (w1, l1), (w4, l4) = results
    assert all(torch.equal(w1[k], w4[k]) for k in w1)
    assert l1 == l4


def test_multi_epoch_and_max_steps(tiny_data, tmp_path):
    train, evald = tiny_data
    cfg = List([RFModelConfig(model_name="tiny", peft_config=RFLoraConfig(r=4, target_modules=SMALL),
                              training_args=sft_args(1e-3, num_train_epochs=2)),
                RFModelConfig(model_name="tiny", peft_config=RFLoraConfig(r=4, target_modules=SMALL),
                              training_args=sft_args(1e-3, max_steps=11))])
    e = Experiment("epochs", experiment_path=tmp_path)
    e.run_fit(RFGridSearch(cfg, trainer_type="SFT"), tiny_create_model, train, None, num_chunks=2)
    info = e.get_runs_info().set_index("run_id")
    assert info.loc[1, "total_steps"] == 16 and info.loc[1, "completed_steps"] == 16
    assert info.loc[2, "total_steps"] == 11 and info.loc[2, "completed_steps"] == 11
    tl = e.get_timeline()
    assert sorted(tl[tl.run_id == 1].epoch.tolist()) == [0, 0, 1, 1]
    # each round in run-id order: the run just trained never goes again while the other could
    assert tl.run_id.tolist()[:4] == [1, 2, 1, 2]
    # the LR schedule spans the whole run: the warm-up is at the start only, then a linear decay to 0
    res = e.get_results()
    lrs = res[(res.run_id == 1) & (res.metric == "learning_rate")].sort_values("step").value.tolist()
    assert lrs[0] < lrs[1] <= lrs[2] and lrs[2] == max(lrs) and lrs[-1] < lrs[len(lrs) // 2]
    e.end()


def test_full_fine_tuning_runs(tiny_data, tmp_path):
    train, evald = tiny_data
    cfg = RFModelConfig(model_name="tiny", training_args=sft_args(List([1e-3, 1e-4])))
    e = Experiment("full", experiment_path=tmp_path)
    e.run_fit(RFGridSearch(cfg, trainer_type="SFT"), tiny_create_model, train, evald, num_chunks=2)
    assert set(e.get_runs_info().status) == {"completed"}
    w1, w2 = e.engine.run_weights(1), e.engine.run_weights(2)
    assert any(not torch.equal(w1[k], w2[k]) for k in w1), "each full-FT run has its own weights"
    e.end()


def test_export_round_trip_gives_identical_logits(four_run_experiment, tmp_path):
    from peft import PeftModel, get_peft_model

    from rapidfire_nb.automl import build_lora_config

    exp, _ = four_run_experiment
    out = exp.export(2, tmp_path / "run2")
    assert (out / "adapter_config.json").exists() and (out / "adapter_model.safetensors").exists()
    base, tok = make_tiny_model_and_tokenizer()
    loaded = PeftModel.from_pretrained(base, str(out)).eval()
    # reference: a fresh base with the run's LoRA config and the weights the engine trained
    ref_base, _ = make_tiny_model_and_tokenizer()
    ref = get_peft_model(ref_base, build_lora_config(exp.engine.snapshot()[2].spec), adapter_name="run_2")
    trained = exp.engine.run_weights(2)
    own = dict(ref.named_parameters())
    with torch.no_grad():
        for name, value in trained.items():
            own[name].copy_(value)
    ref.eval()
    ids = tok(["Reverse the word: apple\nAnswer:"], return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, ref(ids).logits)
        assert not torch.equal(loaded(ids).logits, make_tiny_model_and_tokenizer()[0](ids).logits)


def test_bad_input_is_refused_before_training(tiny_data, tmp_path):
    from datasets import Dataset

    train, evald = tiny_data
    group = RFGridSearch(one_config(), trainer_type="SFT")
    bad_cols = Dataset.from_list([{"question": "a", "answer": "b"}] * 16)
    e = Experiment("bad", experiment_path=tmp_path)
    with pytest.raises(ConfigError, match="columns"):
        e.run_fit(group, tiny_create_model, bad_cols, None)
    with pytest.raises(ConfigError, match="num_chunks"):
        e.run_fit(group, tiny_create_model, train, None, num_chunks=0)
    with pytest.raises(ConfigError, match="num_chunks=99"):
        e.run_fit(group, tiny_create_model, train, None, num_chunks=99)
    with pytest.raises(ConfigError, match="create_model must return"):
        e.run_fit(group, lambda cfg: "not a model", train, None)
    with pytest.raises(ConfigError, match="model"):
        e.run_fit(group, lambda cfg: ("model", "tok"), train, None)
    assert e.engine is None and not (e.path / "runs.json").exists()
    assert not any(ev["type"] == "run_created" for ev in e.events.since(0))
    e.end()


def test_checkpoints_are_written_off_the_engine_thread_and_logged_only_once_on_disk(tiny_data, tmp_path):
    """The writer thread makes a chunk durable while the next chunk trains; the log never runs
    ahead of the checkpoints, and a run never trains while its own checkpoint is in flight."""
    import threading

    from rapidfire_nb.engine.store import ExperimentStore

    train, evald = tiny_data
    writers: list[str] = []
    real_save = ExperimentStore.save_checkpoint

    def save_checkpoint(self, run_id, state):  # the real write, with the writing thread noted
        writers.append(threading.current_thread().name)
        return real_save(self, run_id, state)

    exp = Experiment("writer", experiment_path=tmp_path)
    seen: list[tuple] = []

    def on_event(ev):
        # runs in the thread that appends: the chunk's checkpoint must already be on disk
        if ev["type"] == "chunk_done":
            ckpt = exp.store.load_checkpoint(ev["run_id"])
            seen.append((ev["run_id"], ev["chunks_done"], ckpt["counters"]["chunks_done"],
                         threading.current_thread().name))

    exp.events.subscribe(on_event)
    ExperimentStore.save_checkpoint = save_checkpoint
    try:
        exp.run_fit(RFGridSearch(four_configs(), trainer_type="SFT"), tiny_create_model, train,
                    evald, num_chunks=3, seed=7)
    finally:
        ExperimentStore.save_checkpoint = real_save
    assert set(exp.get_runs_info().status) == {"completed"}
    assert len(writers) == 12 and set(writers) == {"rapidfire-ckpt-writer"}
    assert len(seen) == 12
    for run_id, logged, on_disk, thread in seen:
        assert on_disk == logged, f"run {run_id}: chunk {logged} logged with checkpoint {on_disk}"
        assert thread == "rapidfire-ckpt-writer"
    # fairness still holds with writes in flight: every run finishes chunk k before any starts k+1
    tl = exp.get_timeline().sort_values("start")
    assert list(tl.chunk) == [0] * 4 + [1] * 4 + [2] * 4
    # the engine's own share of a checkpoint is the snapshot; the writer's time is reported apart
    assert tl.snapshot_s.notna().all() and tl.checkpoint_s.notna().all()
    assert exp.engine.persistence.writer.jobs_done == 12 and not exp.engine.persistence.writer.busy()
    exp.end()


def test_embedding_adapters_are_checkpointed_resumed_and_exported(tiny_data, tmp_path):
    """LoRA on embed_tokens keeps its weights in a ParameterDict (no trailing ".weight"): they must
    be part of the run's weights, its checkpoint, a resume from disk, and the exported adapter."""
    train, evald = tiny_data
    lora = RFLoraConfig(r=4, target_modules=["q_proj", "embed_tokens"])
    cfg = RFModelConfig(model_name="tiny", peft_config=lora, training_args=sft_args(1e-2))
    group = RFGridSearch(cfg, trainer_type="SFT")

    ref = Experiment("emb-ref", experiment_path=tmp_path)
    ref.run_fit(group, tiny_create_model, train, evald, num_chunks=2, seed=7)
    ref_w = ref.engine.run_weights(1)
    ref.end()
    emb = [k for k in ref_w if "lora_embedding" in k]
    assert len(emb) == 2, sorted(ref_w)

    exp = Experiment("emb", experiment_path=tmp_path)
    exp.events.subscribe(lambda ev: ev["type"] == "chunk_done" and ev["chunk"] == 0 and exp.stop(1))
    exp.run_fit(group, tiny_create_model, train, evald, num_chunks=2, seed=7)
    assert exp.get_runs_info().status.tolist() == ["stopped"]
    exp.end()
    again = Experiment("emb", experiment_path=tmp_path, resume=True)   # from the checkpoint on disk
    again.run_fit(group, tiny_create_model, train, evald, num_chunks=2, seed=7)
    again.resume(1)
    assert again.wait(timeout=300)
    for k, v in ref_w.items():
        assert torch.equal(again.engine.run_weights(1)[k], v), k
    out = again.export(1, tmp_path / "adapter")
    again.end()
    from safetensors.torch import load_file

    saved = load_file(str(out / "adapter_model.safetensors"))
    assert not [k for k in saved if "run_1" in k]
    assert {k for k in saved if "lora_embedding" in k} == {
        ".".join(p for p in k.split(".") if p != "run_1") for k in emb}


# -- what ran before in the kernel changes nothing --------------------------------------------
# Users train a plain TRL baseline next to rapidfire in one notebook. TRL's configs default to
# bf16=True (CPU autocast with use_cpu=True), and a plain SFTTrainer(...).train() leaves
# accelerate's process-wide state set to bf16; a later run with another precision must still
# train (accelerate refuses to change an AcceleratorState already initialized).

def config(bf16: bool):
    return RFModelConfig(
        model_name="tiny", peft_config=RFLoraConfig(r=4, target_modules=["q_proj", "v_proj"]),
        training_args=RFSFTConfig(learning_rate=1e-3, per_device_train_batch_size=4,
                                  num_train_epochs=1, max_length=64, bf16=bf16))


def test_runs_train_after_a_plain_bf16_sft_trainer_and_mix_precisions(tmp_path):
    from trl import SFTConfig, SFTTrainer

    train, evald = make_demo_datasets(16, 4)
    ref = Experiment("before", experiment_path=tmp_path, tracking=[])
    ref.run_fit(RFGridSearch(config(False), trainer_type="SFT"), tiny_create_model, train, evald,
                num_chunks=2, seed=3)
    ref_weights = ref.engine.run_weights(1)
    ref.end()

    # a plain TRL baseline in the same process, with TRL's default precision
    model, tok = tiny_create_model({"model_kwargs": {}})
    args = SFTConfig(output_dir=str(tmp_path / "plain"), use_cpu=True, max_steps=1, report_to=[],
                     per_device_train_batch_size=4, max_length=64, save_strategy="no",
                     disable_tqdm=True)
    assert args.bf16, "TRL's default is bf16=True: the case this test is about"
    SFTTrainer(model=model, args=args, train_dataset=train, processing_class=tok).train()

    exp = Experiment("after", experiment_path=tmp_path, tracking=[])
    exp.run_fit(RFGridSearch(List([config(False), config(True)]), trainer_type="SFT"),
                tiny_create_model, train, evald, num_chunks=2, seed=3)
    info = exp.get_runs_info()
    assert list(info.status) == ["completed", "completed"], info.error.tolist()
    # the fp32 run is exactly the one trained before the baseline: history changed nothing
    w = exp.engine.run_weights(1)
    assert w.keys() == ref_weights.keys()
    for k, v in ref_weights.items():
        assert torch.equal(w[k], v), k
    exp.end()
