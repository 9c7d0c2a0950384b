"""The engine's warnings and library logs go to its log file, with nothing process-wide left behind.

Importing rapidfire_nb installs nothing (no ``warnings.showwarning`` hook, no warning filter, no
logging filter); while an experiment trains, what its engine thread warns or logs goes to
``logs/engine.log`` and other threads keep theirs; once it has ended nothing of ours is installed.
"""

import json
import logging
import subprocess
import sys
import threading
import warnings

from rapidfire_nb import Experiment
from rapidfire_nb.automl import RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.demo_data import tiny_create_model
from rapidfire_nb.engine import routing

LOGGERS = ("", "transformers", "trl", "peft", "accelerate", "datasets")


def _handler_filters():
    return {name: [[type(f).__name__ for f in h.filters] for h in logging.getLogger(name).handlers]
            for name in LOGGERS}


def test_importing_rapidfire_installs_no_warning_hook_nor_filter():
    # the libraries first: what they install at import is theirs; then ours must add nothing
    code = r"""
import json, logging, warnings
import datasets, peft, torch, transformers, trl
names = ("", "transformers", "trl", "peft", "accelerate", "datasets")
def state():
    return {"showwarning": repr(warnings.showwarning), "filters": repr(warnings.filters),
            "handlers": {n: [[repr(f) for f in h.filters] for h in logging.getLogger(n).handlers]
                         for n in names}}
before = state()
import rapidfire_nb, rapidfire_nb.experiment, rapidfire_nb.engine.controller, rapidfire_nb.engine.adapters.sft
import rapidfire_nb.engine.adapters.dpo, rapidfire_nb.engine.adapters.grpo
print(json.dumps({"before": before, "after": state()}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["after"]["showwarning"] == seen["before"]["showwarning"]
    assert seen["after"]["filters"] == seen["before"]["filters"]
    assert seen["after"]["handlers"] == seen["before"]["handlers"]


def _config():
    return RFModelConfig(model_name="tiny", peft_config=RFLoraConfig(r=4, target_modules=["q_proj"]),
                         training_args=RFSFTConfig(learning_rate=1e-3, per_device_train_batch_size=8,
                                                   max_steps=4, bf16=False, max_length=64))


def test_engine_thread_output_goes_to_its_log_and_nothing_stays_installed(tiny_data, tmp_path):
    train, evald = tiny_data
    # a first experiment imports what training imports lazily (scipy, sympy, ... add warning
    # filters of their own at import): the comparison below is then about what we leave
    warm = Experiment("warm-up", experiment_path=tmp_path)
    warm.run_fit(RFGridSearch(_config(), trainer_type="SFT"), tiny_create_model, train, evald, num_chunks=1)
    warm.end()
    warnings.simplefilter("always")   # every probe reaches showwarning, not only the first
    shown: list[str] = []

    def user_showwarning(message, category, filename, lineno, file=None, line=None):
        shown.append(str(message))

    warnings.showwarning = user_showwarning   # pytest restores its own after the test
    console: list[str] = []

    class ListHandler(logging.Handler):
        def emit(self, record):
            console.append(record.getMessage())

    console_handler = ListHandler()
    lib = logging.getLogger("transformers")
    lib.addHandler(console_handler)
    try:
        filters_before = list(warnings.filters)
        handlers_before = _handler_filters()

        exp = Experiment("routing", experiment_path=tmp_path)
        probes = []

        def probe(event):
            # listeners run in the thread that appends the event: the engine's for run_status
            if event["type"] == "run_status" and threading.current_thread().name == "rapidfire-engine":
                probes.append(routing.is_installed())
                warnings.warn("rf-probe: warned in the engine thread")
                lib.warning("rf-probe: logged in the engine thread")

        exp.events.subscribe(probe)
        exp.run_fit(RFGridSearch(_config(), trainer_type="SFT"), tiny_create_model, train, evald, num_chunks=2,
                    block=False)
        warnings.warn("user: warned in the user's thread")
        lib.warning("user: logged in the user's thread")
        assert exp.wait(timeout=600)
        exp.end()
        handlers_after = _handler_filters()
    finally:
        lib.removeHandler(console_handler)

    assert probes and all(probes), "routing is installed while the engine thread works"
    log = (exp.path / "logs" / "engine.log").read_text()
    assert "rf-probe: warned in the engine thread" in log
    assert "rf-probe: logged in the engine thread" in log
    assert not [m for m in shown if m.startswith("rf-probe")], shown
    assert not [m for m in console if m.startswith("rf-probe")], console
    assert "user: warned in the user's thread" in shown
    assert "user: logged in the user's thread" in console
    # nothing of ours remains: the user's hook, the filters and the handlers are as they were
    assert warnings.showwarning is user_showwarning
    assert list(warnings.filters) == filters_before
    assert handlers_after == handlers_before
    assert not routing.is_installed()
