"""Command line: ``rapidfire demo`` (offline by default), ``rapidfire bench`` and ``rapidfire
report``, dispatched by argparse subcommands; each command's own parser reads its options."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


class _DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    # an option whose help says what "not given" means needs no "(default: None)"
    def _get_help_string(self, action):
        return action.help if action.default is None else super()._get_help_string(action)


def _demo_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rapidfire demo",
                                formatter_class=_DefaultsFormatter,
                                description="Train 4 SFT configs (2 LoRA x 2 learning rates) interleaved, "
                                            "offline on a tiny model, and print a leaderboard. The offline "
                                            "task: answer each animal's colour (a dozen facts); the demo "
                                            "prints what a guess would score, each run's answers, and its own "
                                            "elapsed time (the README gives a measured figure).")
    p.add_argument("--model", default=None, help="a Hugging Face model name (needs the network); "
                                                 "default: a tiny model built offline")
    p.add_argument("--dataset", default=None, help="a Hugging Face dataset name with prompt/completion or "
                                                   "text columns (needs the network); default: synthetic")
    p.add_argument("--num-chunks", type=int, default=4, help="chunks per epoch")
    p.add_argument("--train-size", type=int, default=512, help="training rows")
    p.add_argument("--epochs", type=float, default=3, help="epochs (num_train_epochs of every config)")
    p.add_argument("--lr-high", type=float, default=2e-2,
                   help="learning rate of the first pair of configs (both LoRA sizes)")
    p.add_argument("--lr-low", type=float, default=5e-3,
                   help="learning rate of the second pair of configs (both LoRA sizes)")
    p.add_argument("--path", default="rapidfire_experiments", help="experiment folder parent")
    p.add_argument("--name", default="demo",
                   help="experiment folder name (an existing one gets a new '<name>_2' folder)")
    return p


def demo(argv: list[str]) -> int:
    args = _demo_parser().parse_args(argv)
    started = time.time()
    print("rapidfire demo: loading libraries...", flush=True)
    from rapidfire_nb._quiet import import_peft_quietly

    import_peft_quietly()   # before anything imports peft: no bitsandbytes noise in the output
    from rapidfire_nb import Experiment
    from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
    from rapidfire_nb import demo_data

    if args.model:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        def create_model(cfg):
            tok = AutoTokenizer.from_pretrained(cfg["model_name"])
            return AutoModelForCausalLM.from_pretrained(cfg["model_name"], **cfg["model_kwargs"]), tok

        model_name = args.model
        targets_small, targets_big = ["q_proj", "v_proj"], ["q_proj", "k_proj", "v_proj", "o_proj"]
    else:
        create_model = demo_data.tiny_create_model
        # the big adapter also covers the MLP: on a randomly initialised base, attention-only
        # adapters learn the facts slowly, which is the difference the leaderboard should show
        model_name, targets_small, targets_big = "tiny-llama-offline", ["q_proj", "v_proj"], [
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model_kwargs = {} if args.model else dict(demo_data.DEMO_MODEL_KWARGS)
    if args.dataset:
        from datasets import load_dataset

        ds = load_dataset(args.dataset, split="train").shuffle(seed=0)
        train = ds.select(range(min(args.train_size, len(ds) - 64)))
        evald = ds.select(range(len(ds) - 64, len(ds)))
    else:
        train, evald = demo_data.make_demo_datasets(args.train_size, 32, task="colors")
        print("task: 'What color is the fox?' -> ' green' (one colour per animal, "
              f"{len(demo_data.ANIMAL_COLORS)} facts). For scale: a uniform guess over the vocabulary has "
              f"eval_loss {demo_data.uniform_guess_loss(demo_data.make_tokenizer()):.2f}; lower is better, "
              "and the leaderboard checks each run's answers.", flush=True)

    loras = List([RFLoraConfig(r=8, lora_alpha=16, target_modules=targets_small, lora_dropout=0.05),
                  RFLoraConfig(r=32, lora_alpha=64, target_modules=targets_big, lora_dropout=0.05)])
    configs = List([
        RFModelConfig(model_name=model_name, peft_config=loras, model_kwargs=model_kwargs,
                      training_args=RFSFTConfig(learning_rate=lr, per_device_train_batch_size=16,
                                                num_train_epochs=args.epochs, lr_scheduler_type="linear",
                                                warmup_steps=2, bf16=False, max_length=64))
        for lr in (args.lr_high, args.lr_low)
    ])
    group = RFGridSearch(configs, trainer_type="SFT")
    exp = Experiment(args.name, experiment_path=args.path)
    t0 = time.time()
    exp.run_fit(group, create_model, train, evald, num_chunks=args.num_chunks, seed=42, block=False)
    info = exp.get_runs_info()
    print(f"{len(info)} runs, {args.num_chunks} chunks per epoch; experiment folder: {exp.path}")
    from rapidfire_nb.engine import get_run, new_table, reduce

    table = new_table()     # folded as events arrive: each one is read once
    while True:
        done = exp.wait(timeout=0.5)
        for ev in exp.events.since(table["last_seq"]):
            reduce(table, ev)
            if ev["type"] == "chunk_done":
                loss = get_run(table, ev["run_id"])["latest"].get("eval_loss")
                loss = float("nan") if loss is None else loss
                print(f"  [{time.time() - t0:6.1f}s] run {ev['run_id']} epoch {ev['epoch'] + 1} chunk "
                      f"{ev['chunk'] + 1}/{args.num_chunks}: step {ev['completed_steps']}/{ev['total_steps']}, "
                      f"eval_loss {loss:.4f}", flush=True)
            elif ev["type"] == "run_status" and ev["status"] == "failed":
                print(f"  run {ev['run_id']} FAILED: {ev.get('reason')}", flush=True)
        if done:
            break
    info = exp.get_runs_info()
    cols = [c for c in info.columns if c in ("run_id", "status", "learning_rate", "r", "target_modules",
                                             "completed_steps", "eval_loss")]
    board = info[cols].copy()
    answers = {}
    if not args.model and not args.dataset:
        answers = _colors_answers(exp, [int(r) for r in info.run_id[info.status == "completed"]])
        board["correct"] = [f"{answers[r][0]}/{len(demo_data.ANIMALS)}" if r in answers else "–"
                            for r in info.run_id]
    board = board.sort_values("eval_loss")
    print("\nLeaderboard (lower eval_loss is better"
          + ("; correct = animals whose colour the run's adapter answers, greedy decoding;"
             f" a random colour gets about {len(demo_data.ANIMALS) / len(demo_data.COLORS):.1f}"
             if answers else "") + "):")
    print(board.to_string(index=False))
    if answers:
        print("(eval_loss averages the answer's tokens, the colour and the end-of-text token; a run "
              "that learned the facts has both a low eval_loss and most answers right.)")
        best = int(board.run_id.iloc[0])
        print(f"\nrun {best} answers: " + "; ".join(answers[best][1][:4]))
    split = exp.time_split()
    wall = time.time() - t0
    print(f"\nwall {wall:.1f}s; engine time split: train {split['train']:.1f}s, eval {split['eval']:.1f}s, "
          f"swap {split['swap']:.3f}s, other {split['other']:.1f}s")
    print(f"logs, checkpoints and TensorBoard files: {exp.path}")
    print(f"  tensorboard --logdir {exp.path / 'tensorboard'}")
    exp.end()
    print(f"rapidfire demo: done in {time.time() - started:.0f} s (loading, training and the answers check)")
    failed = (info["status"] == "failed").any()
    return 1 if failed else 0


def _colors_answers(exp, run_ids: list[int]) -> dict[int, tuple[int, list[str]]]:
    """Each run's adapter asked every animal's colour: (how many right, a few sample lines)."""
    import tempfile
    import warnings

    import torch
    from peft import PeftModel

    from rapidfire_nb import demo_data

    out = {}
    # transformers' deprecation notes from loading the adapters are not the demo's business
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        for rid in run_ids:
            base, tok = demo_data.tiny_create_model({"model_kwargs": dict(demo_data.DEMO_MODEL_KWARGS)})
            model = PeftModel.from_pretrained(base, str(exp.export(rid, f"{tmp}/run{rid}"))).eval()
            right, lines = 0, []
            for animal, color in demo_data.ANIMAL_COLORS.items():
                prompt = demo_data.colors_prompt(animal)
                x = tok(prompt, return_tensors="pt")
                with torch.no_grad():
                    y = model.generate(**x, max_new_tokens=3, do_sample=False, pad_token_id=tok.pad_token_id)
                said = tok.decode(y[0, x["input_ids"].shape[1]:], skip_special_tokens=True).strip()
                right += said.split()[:1] == [color]
                lines.append(f"{prompt} -> {said!r}{'' if said.split()[:1] == [color] else f' (is {color})'}")
            out[rid] = (right, lines)
    return out


def _report_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rapidfire report", formatter_class=_DefaultsFormatter,
        description="Write one self-contained HTML file (plotly.js inside, no network needed) of an "
                    "experiment folder: the curves of every metric, the leaderboard, the engine "
                    "time split and the chunk timeline. It reads the folder's event log and "
                    "nothing else that matters: no lock is taken, nothing in the folder is "
                    "written or executed, so it works on a finished, stopped or crashed "
                    "experiment, on one still training and on a read-only copy.")
    p.add_argument("folder", help="the experiment folder (the one holding events.jsonl, "
                                  "e.g. rapidfire_experiments/<name>)")
    p.add_argument("-o", "--output", default=None,
                   help="the HTML file to write, outside the experiment folder; default: "
                        "<folder name>-report.html in the current folder")
    p.add_argument("-f", "--force", action="store_true",
                   help="replace the output file if it exists (without it, an existing file is "
                        "refused)")
    return p


def _default_report_name(folder: str) -> str:
    # the folder's own name, never a name read from its log: a crafted log must not steer the
    # file anywhere but the current folder
    name = Path(folder).resolve().name
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name).lstrip(".")
    return f"{safe or 'experiment'}-report.html"


def report(argv: list[str]) -> int:
    args = _report_parser().parse_args(argv)
    from rapidfire_nb.engine import EventLogError
    from rapidfire_nb.report import ReportError, read_folder, write_report

    try:
        table, meta = read_folder(args.folder)
        out = Path(args.output) if args.output else Path(_default_report_name(args.folder))
        write_report(table, out, meta=meta, source=str(Path(args.folder).resolve()),
                     overwrite=args.force, outside=args.folder)
    except (ReportError, EventLogError) as exc:
        print(f"rapidfire report: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"rapidfire report: {exc.strerror or exc}: {exc.filename or args.folder}", file=sys.stderr)
        return 2
    runs = sum(1 for r in table["runs"].values() if r["created"])
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB): {runs} runs, {table['last_seq']} events")
    return 0


def _parser() -> argparse.ArgumentParser:
    """The command and its help; each command parses its own options (``rapidfire demo --help``)."""
    p = argparse.ArgumentParser(
        prog="rapidfire", description="Fine-tune many configurations at once by chunk interleaving.",
        epilog="'rapidfire demo --help', 'rapidfire bench --help' and 'rapidfire report --help' "
               "list each command's options.")
    sub = p.add_subparsers(dest="command", metavar="{demo,bench,report}")
    sub.add_parser("demo", add_help=False,
                   help="train 4 configs interleaved on a tiny offline model and print a leaderboard")
    sub.add_parser("bench", add_help=False,
                   help="compare interleaved training against plain sequential TRL")
    sub.add_parser("report", add_help=False,
                   help="write a self-contained HTML report of an experiment folder")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if args.command is None:
        if rest:   # options without a command
            parser.error(f"unrecognized arguments: {' '.join(rest)} (give a command first)")
        parser.print_help()
        return 0
    if args.command == "demo":
        return demo(rest)
    if args.command == "report":
        return report(rest)
    from rapidfire_nb.bench import main as bench_main

    return bench_main(rest)


if __name__ == "__main__":
    sys.exit(main())
