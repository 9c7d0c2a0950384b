"""Parking runs in host memory (``Experiment(offload=...)``): exact, and only the run's own state.

On this CPU-only machine host and device are the same memory, so "moving" is a copy into new
storage; that still exercises everything but the transfer itself: which tensors belong to a run,
that parameters keep their identity (the optimizer keys on them), that optimizer state follows,
and that training after a park/unpark cycle is bit-identical.
"""

from __future__ import annotations

import pytest
import torch

from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.demo_data import tiny_create_model
from rapidfire_nb.errors import ConfigError

pytestmark = pytest.mark.slow   # slow tier: trains offloaded and resident experiments side by side


def group(full: bool = False):
    lora = None if full else RFLoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.1)
    args = RFSFTConfig(learning_rate=List([1e-3, 3e-3, 1e-2]), per_device_train_batch_size=8,
                       num_train_epochs=1, bf16=False, max_length=64)
    return RFGridSearch(RFModelConfig(model_name="tiny", peft_config=lora, training_args=args),
                        trainer_type="SFT")


def train_losses(exp, run_id):
    df = exp.get_results()
    sel = df[(df.run_id == run_id) & (df.split == "train") & (df.metric == "loss")]
    return list(zip(sel.step, sel.value))


def finish(tmp_path, name, data, offload, full):
    exp = Experiment(name, experiment_path=tmp_path, tracking=[], offload=offload)
    exp.run_fit(group(full), tiny_create_model, *data, num_chunks=4, seed=3)
    assert set(exp.get_runs_info().status) == {"completed"}
    out = ({r: exp.engine.run_weights(r) for r in (1, 2, 3)}, {r: train_losses(exp, r) for r in (1, 2, 3)},
           exp.engine.executor.residency.parks_done)
    exp.end()
    return out


@pytest.mark.parametrize("full", [False, True], ids=["lora", "full-fine-tuning"])
def test_parking_every_idle_run_is_bit_identical(tiny_data, tmp_path, full):
    never_w, never_l, never_parks = finish(tmp_path, "never", tiny_data, "never", full)
    always_w, always_l, always_parks = finish(tmp_path, "always", tiny_data, "always", full)
    for rid in (1, 2, 3):
        assert never_l[rid] == always_l[rid]
        for k, v in never_w[rid].items():
            assert torch.equal(always_w[rid][k], v), f"run {rid}: {k}"
    # 3 runs x 4 chunks: every run but the first is parked at least once per round after its chunk
    assert never_parks == 0 and always_parks >= 6


def test_park_moves_only_the_runs_own_state_and_unpark_restores_it(tiny_data, tmp_path):
    train, evald = tiny_data
    exp = Experiment("park", experiment_path=tmp_path, tracking=[], offload="never")

    def stop_after_first_chunk(ev):
        if ev["type"] == "chunk_done" and ev["chunk"] == 0:
            exp.stop(ev["run_id"])

    exp.events.subscribe(stop_after_first_chunk)
    exp.run_fit(group(), tiny_create_model, train, evald, num_chunks=4, seed=3)
    assert set(exp.get_runs_info().status) == {"stopped"}
    engine = exp.engine
    rt = engine.executor.trainers[1]
    model = rt.model
    own = dict(rt.trainable_named_parameters())
    shared = {n: p for n, p in model.named_parameters() if n not in own}
    opt_state = [s for s in rt.optimizer.state.values()]
    assert own and shared and opt_state
    before_ptr = {n: p.data_ptr() for n, p in model.named_parameters()}
    before_val = {n: p.detach().clone() for n, p in own.items()}
    before_opt = [{k: v.clone() for k, v in s.items()} for s in opt_state]
    ids = {n: id(p) for n, p in own.items()}

    moved = rt.park("cpu")
    expected = sum(p.numel() * p.element_size() for p in own.values()) + sum(
        v.numel() * v.element_size() for s in opt_state for v in s.values() if torch.is_tensor(v))
    assert rt.parked and moved == expected == rt.parked_bytes()
    after = dict(model.named_parameters())
    for n in own:
        assert after[n].data_ptr() != before_ptr[n], f"{n} was not moved"
        assert id(after[n]) == ids[n], "the Parameter object must stay (the optimizer keys on it)"
    for n in shared:
        assert after[n].data_ptr() == before_ptr[n], f"shared weight {n} must not move"
    assert rt.park("cpu") == 0, "parking twice moves nothing"

    assert rt.unpark() == expected and not rt.parked and rt.parked_bytes() == 0
    for n, v in before_val.items():
        assert torch.equal(own[n], v)
    for s, saved in zip(opt_state, before_opt):
        for k, v in saved.items():
            assert torch.equal(s[k], v)

    # parked runs resume exactly: park run 2, then let both finish; compare with never parked
    engine.executor.trainers[2].park("cpu")
    exp.resume(1)
    exp.resume(2)
    exp.resume(3)
    assert exp.wait(timeout=300)
    parked_then = {r: exp.engine.run_weights(r) for r in (1, 2, 3)}
    exp.end()
    ref_w, _, _ = finish(tmp_path, "ref", tiny_data, "never", False)
    for rid in (1, 2, 3):
        for k, v in ref_w[rid].items():
            assert torch.equal(parked_then[rid][k], v), f"run {rid}: {k}"


def test_auto_moves_nothing_without_a_gpu_and_bad_values_are_refused(tiny_data, tmp_path):
    train, evald = tiny_data
    exp = Experiment("auto", experiment_path=tmp_path, tracking=[])
    assert exp.offload == "auto"
    parked_seen = []

    def watch(ev):
        if ev["type"] == "chunk_done":
            parked_seen.extend(rt.parked for rt in list(exp.engine.executor.trainers.values()))

    exp.events.subscribe(watch)
    exp.run_fit(group(), tiny_create_model, train, evald, num_chunks=4, seed=3)
    assert parked_seen and not any(parked_seen)
    exp.end()
    with pytest.raises(ConfigError, match="offload='sometimes'"):
        Experiment("bad", experiment_path=tmp_path, offload="sometimes")
    assert not (tmp_path / "bad").exists()


def rl_group(kind: str):
    from helpers import PREFERENCE_LORA, dpo_args, grpo_args, short_answer

    from rapidfire_nb.automl import RFLoraConfig as Lora

    if kind == "dpo-lora":
        cfg = RFModelConfig(model_name="tiny", peft_config=Lora(**PREFERENCE_LORA),
                            training_args=dpo_args(List([1e-3, 2e-2]), 0.1))
        return RFGridSearch(cfg, trainer_type="DPO")
    if kind == "dpo-full":
        cfg = RFModelConfig(model_name="tiny", training_args=dpo_args(List([1e-4, 1e-3]), 0.1))
        return RFGridSearch(cfg, trainer_type="DPO")
    cfg = RFModelConfig(model_name="tiny", peft_config=Lora(**PREFERENCE_LORA), reward_funcs=[short_answer],
                        training_args=grpo_args(List([1e-3, 2e-2]), 2, beta=0.1))
    return RFGridSearch(cfg, trainer_type="GRPO")


@pytest.mark.parametrize("kind", ["dpo-lora", "dpo-full", "grpo-lora"])
def test_parking_is_exact_for_dpo_and_grpo_too(tmp_path, kind):
    # their references (adapters off, or a frozen copy per base) are shared and never parked
    from rapidfire_nb.demo_data import make_dpo_dataset, make_grpo_dataset

    if kind.startswith("dpo"):
        data = make_dpo_dataset(16, seed=0), make_dpo_dataset(4, seed=1)
    else:
        data = make_grpo_dataset(8, seed=0), make_grpo_dataset(2, seed=1)
    out = {}
    for offload in ("never", "always"):
        exp = Experiment(f"{kind}-{offload}", experiment_path=tmp_path, tracking=[], offload=offload)
        exp.run_fit(rl_group(kind), tiny_create_model, *data, num_chunks=2, seed=5)
        info = exp.get_runs_info()
        assert set(info.status) == {"completed"}, info.error.tolist()
        out[offload] = ({r: exp.engine.run_weights(r) for r in (1, 2)}, {r: train_losses(exp, r) for r in (1, 2)})
        exp.end()
    for rid in (1, 2):
        assert out["never"][1][rid] == out["always"][1][rid]
        for k, v in out["never"][0][rid].items():
            assert torch.equal(out["always"][0][rid][k], v), f"run {rid}: {k}"
