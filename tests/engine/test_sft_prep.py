"""SFT data preparation in one pass: the same rows, types and column order as TRL's own maps.

The engine prepares a run's SFT data once per experiment through TRL's ``_prepare_dataset`` over
the dataset's iterable form (engine/adapters/sft.py); these tests compare the result with TRL's
``Dataset`` path on the forms SFT takes, and check the cases that must go TRL's usual way."""

import datasets
import pytest
from trl import SFTConfig, SFTTrainer

from rapidfire_nb.demo_data import make_sft_dataset, make_tokenizer, make_tiny_model
from rapidfire_nb.engine.adapters import sft as sft_adapter
from rapidfire_nb.engine.adapters.sft import _one_pass_applies, prepare_in_one_pass

N = 160
pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


def trainer(tok, tmp_path, **kw):
    args = SFTConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], max_length=kw.pop("max_length", 64),
                     save_strategy="no", disable_tqdm=True, **kw)
    small = make_sft_dataset(4)
    return SFTTrainer(model=make_tiny_model(tok), args=args, train_dataset=small, processing_class=tok), args


def chat(row):
    return {"messages": [{"role": "user", "content": row["prompt"]},
                         {"role": "assistant", "content": row["completion"]}]}


def chat_pc(row):
    return {"prompt": [{"role": "user", "content": row["prompt"]}],
            "completion": [{"role": "assistant", "content": row["completion"]}]}


def text(row):
    return {"text": row["prompt"] + " " + row["completion"]}


def forms():
    base = make_sft_dataset(N, seed=5)
    with_id = base.add_column("row_id", list(range(N))).cast_column("row_id", datasets.Value("int16"))
    return {
        "prompt-completion": base,
        "prompt-completion, extra int16 column": with_id,
        "text": base.map(text, remove_columns=["prompt", "completion"]),
        "messages": base.map(chat, remove_columns=["prompt", "completion"]),
        "conversational prompt-completion": base.map(chat_pc),
    }


def same(a, b):
    assert a.column_names == b.column_names
    assert a.features == b.features
    assert len(a) == len(b)
    assert a.to_dict() == b.to_dict()


@pytest.mark.parametrize("form", list(forms()))
def test_one_pass_gives_what_trls_maps_give(form, tok, tmp_path):
    data = forms()[form]
    tr, args = trainer(tok, tmp_path)
    assert _one_pass_applies(data, args, False)
    ours = prepare_in_one_pass(tr._prepare_dataset, data, tok, args, False, None, "train")
    assert ours is not None, "the one pass gave up on a form it should prepare"
    same(ours, tr._prepare_dataset(data, tok, args, False, None, "train"))


def test_truncation_that_drops_rows_drops_the_same_rows(tok, tmp_path):
    # keep_start at a length shorter than some prompts: those rows have no label left and go
    base = make_sft_dataset(N, seed=7)
    data = datasets.Dataset.from_list([
        {"prompt": (r["prompt"] + " ") * (12 if i % 3 == 0 else 1), "completion": r["completion"]}
        for i, r in enumerate(base)])
    tr, args = trainer(tok, tmp_path, max_length=24)
    theirs = tr._prepare_dataset(data, tok, args, False, None, "train")
    assert 0 < len(theirs) < N, "the case needs some rows dropped and some kept"
    same(prepare_in_one_pass(tr._prepare_dataset, data, tok, args, False, None, "train"), theirs)


def test_more_rows_than_one_write_batch(tok, tmp_path, monkeypatch):
    monkeypatch.setattr(sft_adapter, "_WRITE_ROWS", 50)
    data = make_sft_dataset(N, seed=9)
    tr, args = trainer(tok, tmp_path)
    ours = prepare_in_one_pass(tr._prepare_dataset, data, tok, args, False, None, "train")
    same(ours, tr._prepare_dataset(data, tok, args, False, None, "train"))


def test_cases_that_take_trls_usual_path(tok, tmp_path):
    data = make_sft_dataset(N)
    _, args = trainer(tok, tmp_path)
    assert not _one_pass_applies(data, args, True)                           # packing
    assert not _one_pass_applies(data.select([]), args, False)               # no rows
    assert not _one_pass_applies(data.with_format("torch"), args, False)     # a format
    assert not _one_pass_applies(data.to_iterable_dataset(), args, False)    # already iterable
    tokenized = data.map(lambda r: {"input_ids": tok(r["prompt"])["input_ids"]})
    assert not _one_pass_applies(tokenized, args, False)                     # already tokenized
    _, shuffled = trainer(tok, tmp_path, shuffle_dataset=True)
    assert not _one_pass_applies(data, shuffled, False)
    # a user's formatting_func may change the row it is given or keep state: map and the
    # iterable path would then differ
    assert not _one_pass_applies(data, args, False, lambda row: row["prompt"])


def test_an_error_in_trls_preparation_falls_back_to_trls_own_error(tok, tmp_path):
    # rows without the columns SFT reads: TRL's iterable path fails, and the caller's usual path
    # is where the user sees TRL's message
    data = datasets.Dataset.from_list([{"question": f"q{i}"} for i in range(N)])
    tr, args = trainer(tok, tmp_path)
    assert prepare_in_one_pass(tr._prepare_dataset, data, tok, args, False, None, "train") is None


def test_a_batch_whose_types_differ_from_the_first_goes_trls_way(tok, tmp_path):
    # an extra column empty in the first 1,000 rows (datasets' writer batch) and filled after: the
    # one pass infers another type for the second batch, and never coerces it into the first's
    rows = [{"prompt": f"p{i}", "completion": f"c{i}", "note": None if i < 1000 else "late"}
            for i in range(1100)]
    data = datasets.Dataset.from_list(rows)
    tr, args = trainer(tok, tmp_path)
    assert _one_pass_applies(data, args, False)
    assert prepare_in_one_pass(tr._prepare_dataset, data, tok, args, False, None, "train") is None


def test_columns_that_a_python_round_trip_would_change_go_trls_way(tok, tmp_path):
    # nanoseconds: a timestamp read as Python's datetime has microseconds only; map carries the
    # column from the source table untouched, a pass over Python rows could not
    import pyarrow as pa

    base = make_sft_dataset(8)
    stamps = pa.array([1_577_836_800_000_000_001 + i for i in range(8)], pa.int64()).cast(pa.timestamp("ns"))
    data = datasets.Dataset(datasets.table.InMemoryTable(base.data.table.append_column("at", stamps)))
    _, args = trainer(tok, tmp_path)
    assert not _one_pass_applies(data, args, False)
    nested = base.add_column("meta", [{"at": None, "n": i} for i in range(8)])
    assert _one_pass_applies(nested, args, False)   # structs of plain values are fine
