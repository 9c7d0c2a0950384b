"""The swap's adapter activation leaves the model exactly as PEFT's own ``set_adapter`` does."""

import pytest
from peft import LoraConfig, get_peft_model

from rapidfire_nb.demo_data import make_tiny_model_and_tokenizer
from rapidfire_nb.engine.adapters.base import activate_peft_adapter


def model_state(pm):
    """Everything set_adapter changes: which parameters train, and every active-adapter record."""
    return ([(n, p.requires_grad) for n, p in pm.named_parameters()], pm.active_adapter,
            pm.base_model.active_adapter,
            [(n, m.active_adapters) for n, m in pm.named_modules() if n and hasattr(m, "active_adapters")])


@pytest.fixture
def peft_model():
    model, _ = make_tiny_model_and_tokenizer(hidden_size=32)
    pm = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "k_proj"]), adapter_name="a1")
    # other targets and a modules_to_save wrapper: layers and wrappers one adapter lacks
    pm.add_adapter("a2", LoraConfig(r=4, target_modules=["q_proj", "gate_proj"], modules_to_save=["lm_head"]))
    return pm


@pytest.mark.parametrize("order", [["a1", "a2", "a1"], ["a2", "a2", "a1"]])
def test_activation_matches_set_adapter_whatever_was_active(peft_model, order):
    for name in order:
        peft_model.set_adapter(name)
        expected = model_state(peft_model)
        peft_model.set_adapter("a2" if name == "a1" else "a1")
        activate_peft_adapter(peft_model, name)
        assert model_state(peft_model) == expected, name


def test_an_adapter_added_or_deleted_later_is_found(peft_model):
    activate_peft_adapter(peft_model, "a1")          # fills the cache without a3's layers
    peft_model.add_adapter("a3", LoraConfig(r=2, target_modules=["up_proj"]))
    peft_model.set_adapter("a3")
    expected = model_state(peft_model)
    peft_model.set_adapter("a1")
    activate_peft_adapter(peft_model, "a3")
    assert model_state(peft_model) == expected
    peft_model.delete_adapter("a2")
    peft_model.set_adapter("a1")
    expected = model_state(peft_model)
    peft_model.set_adapter("a3")
    activate_peft_adapter(peft_model, "a1")
    assert model_state(peft_model) == expected
