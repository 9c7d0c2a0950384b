"""A hostile folder, part 3: a report written through a planted link, hard links in a folder,
crafted metric names, unbounded run ids, RfDb names that are paths, path-valued knobs chosen by a
folder, and bad input that used to fail late. Each attack leaves the outside file (or the folder)
byte-identical and is refused with a reason that names the file, the field or the knob.
(Parts 1 and 2: tests/folder/test_folder_safety.py, tests/folder/test_hostile_folder.py.)"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rapidfire_nb import Experiment
from rapidfire_nb.errors import RapidFireError

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "events"
ENV = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def digest(folder: Path) -> dict:
    """Every entry of a folder: its kind and, for a file, its bytes' hash."""
    out = {}
    for p in sorted([folder, *folder.rglob("*")]):
        rel = str(p.relative_to(folder))
        if p.is_symlink():
            out[rel] = ("link", os.readlink(p))
        elif p.is_file():
            out[rel] = ("file", hashlib.sha256(p.read_bytes()).hexdigest())
        else:
            out[rel] = ("dir",)
    return out


def fixture_folder(parent: Path, name: str = "x", fixture: str = "sft_basic") -> Path:
    folder = parent / name
    folder.mkdir(parents=True)
    shutil.copy(FIXTURES / f"{fixture}.jsonl", folder / "events.jsonl")
    return folder


def a_key_file(tmp_path: Path) -> tuple[Path, bytes]:
    victim = tmp_path / "home" / ".ssh" / "authorized_keys"
    victim.parent.mkdir(parents=True)
    content = b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOwner owner@laptop\n" * 200
    victim.write_bytes(content)
    return victim, content


# -- 1. a report (and every other file we write) never goes through a planted link ------------

@pytest.mark.parametrize("plant", ["symlink", "hardlink"])
def test_rapidfire_report_never_writes_through_a_planted_temporary_file(tmp_path, plant):
    """The shared archive holds ``x/`` and ``.x-report.html.tmp`` (a link to the user's
    authorized_keys); the documented ``rapidfire report x`` must leave that file as it was."""
    victim, content = a_key_file(tmp_path)
    work = tmp_path / "archive"
    folder = fixture_folder(work)
    planted = work / ".x-report.html.tmp"
    (os.symlink if plant == "symlink" else os.link)(victim, planted)
    before = digest(folder)
    proc = subprocess.run([sys.executable, "-m", "rapidfire_nb", "report", "x"], cwd=work, env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert victim.read_bytes() == content
    assert digest(folder) == before
    assert "<!DOCTYPE html>" in (work / "x-report.html").read_text(encoding="utf-8")


def test_exp_report_replaces_a_link_at_its_own_name_and_a_planted_temporary(tmp_path):
    from rapidfire_nb.engine.fsio import tmp_path_for
    from rapidfire_nb.report import read_folder, write_report

    victim, content = a_key_file(tmp_path)
    folder = fixture_folder(tmp_path / "exps")
    out = tmp_path / "out" / "report.html"
    out.parent.mkdir()
    os.link(victim, out)                          # the report's own name is a hard link
    os.symlink(victim, tmp_path_for(out))          # and its temporary files planted links
    os.symlink(victim, out.with_name(".report.html.tmp"))
    table, meta = read_folder(folder)
    write_report(table, out, meta=meta)
    assert victim.read_bytes() == content
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert os.stat(out).st_nlink == 1


def test_bench_json_goes_through_the_one_writer(tmp_path):
    """Every file the package writes outside a folder goes through engine/fsio: no module opens
    a file for writing by itself (the one exception, the fsio writer itself, is listed)."""
    import re

    allowed = {ROOT / "rapidfire_nb" / "engine" / "fsio.py"}
    pattern = re.compile(r"""open\([^)]*["'](?:w|a|wb|ab|w\+|a\+|r\+)["']|\.write_(?:text|bytes)\(""")
    offenders = []
    for p in sorted((ROOT / "rapidfire_nb").rglob("*.py")):
        if p in allowed:
            continue
        for number, line in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1):
            if pattern.search(line) and not line.lstrip().startswith("#"):
                offenders.append(f"{p.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "files written around engine/fsio:\n" + "\n".join(offenders)


# -- 2. hard links: refused with the file named, never written in place ------------------------

def test_a_hard_linked_lock_is_refused_and_its_other_name_untouched(tmp_path):
    victim, content = a_key_file(tmp_path)
    folder = tmp_path / "exps" / "x"
    folder.mkdir(parents=True)
    os.link(victim, folder / ".lock")
    with pytest.raises(RapidFireError, match=r"\.lock has 2 hard links"):
        Experiment("x", experiment_path=tmp_path / "exps", tracking=[])
    assert victim.read_bytes() == content
    assert sorted(p.name for p in folder.iterdir()) == [".lock"]


@pytest.mark.parametrize("torn", [False, True])
def test_a_hard_linked_event_log_is_refused_and_never_appended_or_cut(tmp_path, torn):
    outside = tmp_path / "outside.jsonl"
    folder = fixture_folder(tmp_path / "exps")
    (folder / "experiment.json").write_text(json.dumps({"name": "x"}))
    os.replace(folder / "events.jsonl", outside)
    if torn:
        with open(outside, "ab") as f:
            f.write(b'{"seq": 99, "ty')
    os.link(outside, folder / "events.jsonl")
    content = outside.read_bytes()
    before = digest(folder)
    with pytest.raises(RapidFireError, match=r"events\.jsonl has 2 hard links"):
        Experiment("x", experiment_path=tmp_path / "exps", resume=True, tracking=[])
    assert outside.read_bytes() == content
    assert digest(folder) == before
    # the EventLog itself refuses too (a caller that skipped the folder check)
    from rapidfire_nb.engine.events import EventLog

    with pytest.raises(RapidFireError, match="hard links"):
        EventLog(folder / "events.jsonl")
    assert outside.read_bytes() == content and digest(folder) == before


def test_a_hard_linked_folder_still_opens_read_only(tmp_path):
    """Reading writes nothing: a backup made with hard links (rsync --link-dest) opens for its
    results; only training in it is refused."""
    folder = fixture_folder(tmp_path / "exps")
    os.link(folder / "events.jsonl", tmp_path / "backup.jsonl")
    before = digest(folder)
    exp = Experiment.open(folder)
    assert len(exp.get_runs_info()) >= 1
    assert digest(folder) == before


# -- 3. crafted metric names: a linear fold, bounds at write and at read, a capped report -------

class CountingName(str):
    """A metric name that counts how often it is compared: folding must not compare each new
    name with every name seen before (a list's ``in``), which made it quadratic."""
    compared = 0

    def __eq__(self, other):
        CountingName.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def metric_event(seq: int, names, split: str = "train", run_id: int = 1, step: int = 1) -> dict:
    return {"seq": seq, "time": 0.0, "type": "metric", "run_id": run_id, "split": split,
            "step": step, "samples_seen": 4 * step, "epoch": 0, "chunk": 0,
            "metrics": {n: 1.0 for n in names}}


def test_folding_is_linear_in_the_number_of_metric_names():
    from rapidfire_nb.engine import fold

    n = 3000
    names = [CountingName(f"m{i}") for i in range(n)]
    events = [{"seq": 1, "time": 0.0, "type": "run_created", "run_id": 1, "trainer_type": "SFT",
               "config": {}}, metric_event(2, names[: n // 2]), metric_event(3, names, step=2)]
    CountingName.compared = 0
    table = fold(events)
    assert table["train_metrics"] == [str(x) for x in names]
    assert CountingName.compared < 4 * n, f"{CountingName.compared} name comparisons for {n} names"
    assert json.loads(json.dumps(table))["train_metrics"] == table["train_metrics"]


def test_a_log_with_too_many_metric_names_is_refused_naming_file_line_and_field(tmp_path):
    from rapidfire_nb.engine import MAX_METRIC_NAMES, MAX_METRICS_PER_EVENT

    folder = fixture_folder(tmp_path / "exps")
    path = folder / "events.jsonl"
    lines = path.read_text().splitlines()
    seq = len(lines)
    crafted = [json.dumps(metric_event(seq + 1, [f"x{i}" for i in range(MAX_METRICS_PER_EVENT + 1)]))]
    path.write_text("\n".join(lines + crafted) + "\n")
    before = digest(folder)
    with pytest.raises(RapidFireError, match=rf"events\.jsonl, line {seq + 1} .*metric\.metrics: "
                                             rf"{MAX_METRICS_PER_EVENT + 1} metric names in one event"):
        Experiment.open(folder)
    # many events of new names each: the experiment's bound
    per = MAX_METRICS_PER_EVENT
    crafted = [json.dumps(metric_event(seq + 1 + k, [f"x{k}_{i}" for i in range(per)], step=k + 1))
               for k in range(MAX_METRIC_NAMES // per + 1)]
    path.write_text("\n".join(lines + crafted) + "\n")
    before = digest(folder)
    with pytest.raises(RapidFireError, match=rf"more than the {MAX_METRIC_NAMES} an experiment "
                                             "may hold") as refused:
        Experiment.open(folder)
    import re

    line = int(re.search(r"events\.jsonl, line (\d+) \(seq \d+\): metric\.metrics:",
                         str(refused.value)).group(1))
    assert seq < line <= len(lines) + len(crafted)
    proc = subprocess.run([sys.executable, "-m", "rapidfire_nb", "report", str(folder), "-o",
                           str(tmp_path / "r.html")], env=ENV, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2 and f"line {line}" in proc.stderr, proc.stderr
    assert digest(folder) == before and not (tmp_path / "r.html").exists()


def test_too_many_metric_names_are_refused_where_they_are_written(tmp_path):
    from rapidfire_nb.engine import MAX_METRICS_PER_EVENT, EventLog, MetricNamesError

    log = EventLog(tmp_path / "events.jsonl")
    log.append("metric", run_id=1, split="train", step=1, samples_seen=4, metrics={"loss": 1.0})
    data = (tmp_path / "events.jsonl").read_bytes()
    with pytest.raises(MetricNamesError, match=rf"run 1: .*{MAX_METRICS_PER_EVENT + 1} metric names"):
        log.extend([("metric", dict(run_id=1, split="train", step=2, samples_seen=8,
                                    metrics={f"x{i}": 1.0 for i in range(MAX_METRICS_PER_EVENT + 1)}))])
    assert (tmp_path / "events.jsonl").read_bytes() == data and log.last_seq == 1
    log.close()


def test_the_report_draws_a_bounded_number_of_metrics_and_says_which_it_left_out(tmp_path):
    from rapidfire_nb.report import read_folder, report_html
    from rapidfire_nb.report.page import MAX_CURVES_PER_SPLIT

    folder = fixture_folder(tmp_path / "exps")
    path = folder / "events.jsonl"
    lines = path.read_text().splitlines()
    names = [f"crafted_{i}" for i in range(300)]
    lines.append(json.dumps(metric_event(len(lines) + 1, names, step=99)))
    path.write_text("\n".join(lines) + "\n")
    table, meta = read_folder(folder)
    total = len(table["train_metrics"])
    html = report_html(table, meta)
    assert html.count('id="curve-train-') == MAX_CURVES_PER_SPLIT
    assert f"{total - MAX_CURVES_PER_SPLIT} more train metrics logged but not drawn" in html
    assert f'id="curve-train-{MAX_CURVES_PER_SPLIT}"' not in html and ", …" in html


# -- 4. one bound for every run id, where the log is read --------------------------------------

def test_a_clone_with_a_huge_run_id_is_refused_where_the_log_is_read(tmp_path):
    from rapidfire_nb.engine import MAX_RUN_ID

    folder = fixture_folder(tmp_path / "exps")
    (folder / "experiment.json").write_text(json.dumps({"name": "x"}))
    path = folder / "events.jsonl"
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    events = [e for e in events if e["type"] != "experiment_end"]
    created = next(e for e in events if e["type"] == "run_created")
    huge = 2**63 + 5
    events.append({**created, "seq": len(events) + 1, "run_id": huge, "parent_run_id": 1})
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    before = digest(folder)
    message = rf"line {len(events)} .*run_created\.run_id: {huge} is above {MAX_RUN_ID}"
    with pytest.raises(RapidFireError, match=message):
        Experiment.open(folder)
    with pytest.raises(RapidFireError, match=message):
        Experiment("x", experiment_path=tmp_path / "exps", resume=True, tracking=[])
    assert {k: v for k, v in digest(folder).items() if k != ".lock"} == before
    from rapidfire_nb.notebook import _panel_protocol as proto

    assert proto.MAX_RUN_ID == MAX_RUN_ID


# -- 6. RfDb: experiment names are names, not paths ---------------------------------------------

@pytest.mark.parametrize("name", ["../../x", "/tmp/rf-absolute-x", "..", "a/b", "ok\n", ".hidden"])
def test_rfdb_refuses_a_path_for_an_experiment_name(tmp_path, monkeypatch, name):
    from rapidfire_nb.compat.fit.db.rf_db import RfDb
    from rapidfire_nb.errors import ConfigError

    work = tmp_path / "a" / "b" / "work"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    if name.startswith("/"):
        name = str(tmp_path / "abs")
        (Path(name) / "experiment.json").parent.mkdir()
        (Path(name) / "experiment.json").write_text("{}")
    else:
        target = (work / "rapidfire_experiments" / name)
        if ".." in name and "\n" not in name:
            (target / "experiment.json").parent.mkdir(parents=True, exist_ok=True)
            (target / "experiment.json").write_text("{}")
    before = digest(tmp_path)
    with pytest.raises(ConfigError, match="experiment_name .*a name, not a path"):
        RfDb().get_experiments_path(name)
    assert digest(tmp_path) == before


# -- 8. tests and docs start Ray on loopback only ----------------------------------------------

def test_every_ray_start_in_tests_and_docs_binds_to_loopback():
    """A ``ray.init`` that starts a Ray (no ``address=``) binds to every interface unless it is
    given the loopback address, as rapidfire's own start (engine/workers/pool.py) does; with auth
    disabled, a port open to the network runs anyone's code. The tests' simulated cluster
    (``ray.cluster_utils.Cluster``) names loopback for its head and for every node it adds."""
    import re

    starts = re.compile(r"^\s*(?:\w+\s*=\s*)?ray\.init\(")
    nodes = re.compile(r"(?<![\w.])Cluster\(|\.add_node\(")
    files = [*(ROOT / "tests").rglob("*.py"), *(ROOT / "docs").rglob("*.md"),
             *(ROOT / "notebooks").rglob("*.ipynb"), ROOT / "README.md"]
    wrong = []
    clusters = 0
    for p in files:
        lines = p.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines, start=1):
            code = line.replace('\\"', '"').strip().removeprefix('"') if p.suffix == ".ipynb" else line
            call = " ".join(lines[number - 1:number + 2]).replace('\\"', '"')   # with its next lines
            if nodes.search(code.split("#")[0]) and not code.lstrip().startswith(("def ", "class ")) \
                    and "nodes.search" not in code and "import" not in code:
                clusters += 1
                if not re.search(r"""["']?node_ip_address["']?\s*[=:]\s*["']127\.0\.0\.1["']""", call):
                    wrong.append(f"{p.relative_to(ROOT)}:{number}: {line.strip()}")
                continue
            if not starts.search(code):
                continue
            if not re.search(r"(?<!\w)address=", call.split("#")[0]) \
                    and '_node_ip_address="127.0.0.1"' not in call:
                wrong.append(f"{p.relative_to(ROOT)}:{number}: {line.strip()}")
    assert clusters >= 2, "the check no longer finds the two-node test's cluster and its nodes"
    assert not wrong, "Ray started on every interface:\n" + "\n".join(wrong)


def test_the_tests_ray_keeps_a_loopback_node_address():
    """Ray on Linux replaces a loopback node address with the machine's network address (and
    then listens there and on every interface) unless its multi-machine mode is off:
    conftest.py turns it off before any test imports ray, so a 127.0.0.1 given above stays."""
    pytest.importorskip("ray")
    from ray._private.services import resolve_ip_for_localhost

    assert os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") == "0"
    assert resolve_ip_for_localhost("127.0.0.1") == "127.0.0.1"


# -- 5. bad input fails early, in the right words ----------------------------------------------

def _tiny_group():
    from rapidfire_nb.automl import RFGridSearch

    from helpers import model, sft, to_chat

    return RFGridSearch(model(sft(), formatting_func=to_chat), trainer_type="SFT")


def test_a_model_on_the_meta_device_is_named_before_training(tmp_path):
    from rapidfire_nb.demo_data import tiny_create_model
    from rapidfire_nb.errors import ConfigError

    from helpers import customer_support_rows

    def meta_create_model(model_config):
        m, tok = tiny_create_model(model_config)
        return m.to("meta"), tok

    exp = Experiment("meta", experiment_path=tmp_path, tracking=[])
    try:
        with pytest.raises(ConfigError, match=r"create_model returned base model .* on the meta device"):
            exp.run_fit(_tiny_group(), meta_create_model, customer_support_rows(16),
                        customer_support_rows(4, seed=1), num_chunks=2, block=True)
        assert not (tmp_path / "meta" / "checkpoints").exists()
    finally:
        exp.end()


def test_export_paths_with_a_nul_byte_or_in_a_read_only_place_are_refused_clearly(tmp_path):
    from rapidfire_nb.engine import ExportError, check_export_path

    folder = tmp_path / "exps" / "x"
    folder.mkdir(parents=True)
    with pytest.raises(ExportError, match="holds a NUL byte"):
        check_export_path(str(tmp_path / "a\x00b"), folder)
    from rapidfire_nb.report import ReportError, write_report

    with pytest.raises(ReportError, match="NUL byte"):
        write_report({}, str(tmp_path / "r\x00.html"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exps"]
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running as a user who writes anywhere (root)")
        with pytest.raises(ExportError, match=rf"{locked} is not writable here"):
            check_export_path(locked / "adapter", folder)
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o755)


# -- 7. a folder never chooses what TRL loads ---------------------------------------------------

def test_a_logged_clone_that_sets_a_path_valued_knob_is_refused_on_resume(tmp_path):
    from rapidfire_nb import automl
    from rapidfire_nb.demo_data import tiny_create_model

    from helpers import customer_support_rows

    data = (customer_support_rows(16), customer_support_rows(4, seed=1))
    exp = Experiment("x", experiment_path=tmp_path, tracking=[])
    exp.run_fit(_tiny_group(), tiny_create_model, *data, num_chunks=2, block=True)
    spec = exp.engine.snapshot()[1].spec
    exp.end()
    folder = tmp_path / "x"
    planted = tmp_path / "planted-template"
    planted.mkdir()
    (planted / "chat_template.jinja").write_text("{{ 'planted' }}")
    changes = {"training_args.chat_template_path": str(planted)}
    clone = automl.apply_changes(spec, changes)
    path = folder / "events.jsonl"
    seq = len([line for line in path.read_text().splitlines() if line.strip()])
    with open(path, "a") as f:
        for ev in ({"type": "run_created", "run_id": 2, "trainer_type": "SFT", "knobs": {},
                    "parent_run_id": 1, "warm_start": False, "total_steps": 4, "steps_per_epoch": 4,
                    "num_chunks": 2, "base_samples_seen": 0, "changes": changes,
                    "config": clone.config_dict()},
                   {"type": "run_status", "run_id": 2, "status": "pending", "error": None,
                    "reason": None}):
            seq += 1
            f.write(json.dumps({"seq": seq, "time": 0.0, **ev}) + "\n")
    before = digest(planted)
    exp = Experiment("x", experiment_path=tmp_path, resume=True, tracking=[])
    try:
        exp.run_fit(_tiny_group(), tiny_create_model, *data, num_chunks=2, block=True)
        info = exp.get_runs_info().set_index("run_id")
        assert info.loc[2, "status"] == "failed"
        assert "training_args.chat_template_path" in info.loc[2, "error"]
        assert "run_fit" in info.loc[2, "error"]
        assert info.loc[2, "completed_steps"] == 0
    finally:
        exp.end()
    assert digest(planted) == before


# -- what the red-team review of this round found ------------------------------------------------

def _trained(tmp_path: Path, name: str = "t") -> Experiment:
    from rapidfire_nb.demo_data import tiny_create_model

    from helpers import customer_support_rows

    exp = Experiment(name, experiment_path=tmp_path, tracking=[])
    exp.run_fit(_tiny_group(), tiny_create_model, customer_support_rows(16),
                customer_support_rows(4, seed=1), num_chunks=2, block=True)
    return exp


def test_a_re_export_never_writes_through_links_planted_in_the_earlier_export(tmp_path):
    exp = _trained(tmp_path)
    try:
        out = tmp_path / "out" / "adapter"
        exp.export(1, out)
        symlinked, hardlinked = tmp_path / "victim-sym", tmp_path / "victim-hard"
        symlinked.write_bytes(b"SECRET-SYM")
        hardlinked.write_bytes(b"SECRET-HARD")
        (out / "tokenizer.json").unlink()
        os.symlink(symlinked, out / "tokenizer.json")
        (out / "adapter_config.json").unlink()
        os.link(hardlinked, out / "adapter_config.json")
        exp.export(1, out, overwrite=True)
        assert symlinked.read_bytes() == b"SECRET-SYM"
        assert hardlinked.read_bytes() == b"SECRET-HARD"
        assert not (out / "tokenizer.json").is_symlink()
        assert json.loads((out / "adapter_config.json").read_text())["peft_type"] == "LORA"
        # nothing of the staging or of the replaced export is left beside it
        assert sorted(p.name for p in out.parent.iterdir()) == ["adapter"]
        # the report refuses the experiment's own folder, as `rapidfire report` does
        before = digest(exp.path)
        for inside in ("events.jsonl", "experiment.json"):
            with pytest.raises(RapidFireError, match="inside the experiment folder"):
                exp.report(exp.path / inside)
        assert digest(exp.path) == before
    finally:
        exp.end()


def test_a_lone_surrogate_is_refused_in_a_note_and_in_a_log(tmp_path):
    folder = fixture_folder(tmp_path / "exps")
    before = digest(folder)
    with pytest.raises(ValueError, match="lone surrogate"):
        Experiment.open(folder).note(1, "ok \ud800")
    assert digest(folder) == before
    from rapidfire_nb.notebook._panel_protocol import MessageError, parse_message

    with pytest.raises(MessageError, match="lone surrogate"):
        parse_message({"type": "note", "run_id": 1, "text": "\udfff"})
    crafted = fixture_folder(tmp_path / "crafted")
    lines = (crafted / "events.jsonl").read_text().splitlines()
    last = json.loads(lines[-1])
    lines.append(json.dumps({**metric_event(last["seq"] + 1, ["\ud800x"])}))
    (crafted / "events.jsonl").write_text("\n".join(lines) + "\n")
    before = digest(crafted)
    out = tmp_path / "r.html"
    proc = subprocess.run([sys.executable, "-m", "rapidfire_nb", "report", str(crafted), "-o", str(out)],
                          capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode != 0
    assert "lone surrogate" in proc.stderr and "events.jsonl" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists() and digest(crafted) == before


def test_a_report_may_take_a_long_legal_file_name(tmp_path):
    folder = fixture_folder(tmp_path / "exps")
    out = tmp_path / "out" / ("x" * 245 + ".html")
    out.parent.mkdir()
    proc = subprocess.run([sys.executable, "-m", "rapidfire_nb", "report", str(folder), "-o", str(out)],
                          capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert out.is_file() and sorted(p.name for p in out.parent.iterdir()) == [out.name]


@pytest.mark.parametrize("edited", ["experiment.json", "events.jsonl"])
def test_a_crafted_fingerprint_is_refused_naming_the_file_and_field(tmp_path, edited):
    """A resume refused because the recorded config differs says where it was recorded, so an
    edited folder is told apart from a changed config group; nothing in the folder changes."""
    import json

    from rapidfire_nb.demo_data import tiny_create_model
    from rapidfire_nb.errors import ConfigError

    from helpers import customer_support_rows

    _trained(tmp_path).end()
    folder = tmp_path / "t"
    if edited == "experiment.json":
        meta = json.loads((folder / "experiment.json").read_text())
        meta["runs"][0] = "0" * len(meta["runs"][0])
        (folder / "experiment.json").write_text(json.dumps(meta))
        match = r"experiment.json's runs\[0\] records fingerprint '000000000000\.\.\.'.*experiment.json was edited"
    else:
        lines = (folder / "events.jsonl").read_text().splitlines()
        for i, line in enumerate(lines):
            ev = json.loads(line)
            if ev["type"] == "run_created" and ev["run_id"] == 1:
                ev["config"]["training_args"]["learning_rate"] = 0.5
                lines[i] = json.dumps(ev)
        (folder / "events.jsonl").write_text("\n".join(lines) + "\n")
        match = (r"run 1's config differs from the one logged in .*events.jsonl \(its run_created "
                 r"event\): training_args.learning_rate is 0.5 there, 0.01 here.*that line of "
                 r"events.jsonl was edited")
    before = digest(folder)
    again = Experiment("t", experiment_path=tmp_path, resume=True, tracking=[])
    with pytest.raises(ConfigError, match=match):
        again.run_fit(_tiny_group(), tiny_create_model, customer_support_rows(16),
                      customer_support_rows(4, seed=1), num_chunks=2)
    again.end()
    after = digest(folder)
    before.pop(".lock"), after.pop(".lock")   # the lock notes who holds it: rewritten by any opener
    assert after == before
