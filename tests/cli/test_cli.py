"""The console entry: `rapidfire demo` end to end (offline), and clear usage errors."""

import subprocess
import sys

import pytest


def run(args, cwd):
    return subprocess.run([sys.executable, "-m", "rapidfire_nb", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow
def test_demo_trains_four_configs_and_prints_a_leaderboard(tmp_path):
    proc = run(["demo", "--train-size", "128", "--epochs", "1", "--path", str(tmp_path)], tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = proc.stdout
    assert "4 runs, 4 chunks per epoch" in out
    board = out.split("Leaderboard")[1].splitlines()[2:6]
    assert len(board) == 4 and all("completed" in line for line in board), board
    assert sorted(int(line.split()[0]) for line in board) == [1, 2, 3, 4]
    # progress after every chunk of every run: 4 runs x 4 chunks
    assert out.count(" chunk ") == 16
    assert (tmp_path / "demo" / "events.jsonl").exists()
    # what the numbers mean: a baseline for scale, and each run's answers checked
    assert "a uniform guess over the vocabulary has eval_loss 6.24" in out
    assert "correct" in out.split("Leaderboard")[1].splitlines()[1]
    assert all(line.split()[-1].endswith("/12") for line in board), board
    assert "answers: What color is the" in out
    assert "a run that learned the facts has both a low eval_loss" in out
    assert "rapidfire demo: done in " in out   # its own elapsed time, the figure the README quotes
    # the eval curves tell the configs apart: the best run's loss sits far below the uniform guess
    losses = sorted(float(line.split()[-2]) for line in board)
    assert losses[0] < 6.24 - 1.0, board
    assert "Traceback" not in proc.stderr
    # peft's import of bitsandbytes logs this on a CPU without `kernels`; the demo imports it quietly
    assert "gemm_4bit" not in proc.stderr, proc.stderr[-2000:]


def test_demo_help_explains_every_option_with_its_default(tmp_path):
    out = run(["demo", "--help"], tmp_path).stdout
    text = " ".join(out.split())
    assert "its own elapsed time" in text and "minute" not in text   # one measured figure: the README's
    for needle in ("chunks per epoch (default: 4)", "training rows (default: 512)",
                   "(default: 3)", "(default: 0.02)", "(default: 0.005)", "(default: demo)"):
        assert needle in text, needle
    assert "(default: None)" not in text
    assert "each command's options" in " ".join(run(["--help"], tmp_path).stdout.split())


def test_unknown_command_is_a_clear_error(tmp_path):
    proc = run(["fly"], tmp_path)
    assert proc.returncode == 2 and "invalid choice: 'fly'" in proc.stderr
    assert "demo" in proc.stderr and "bench" in proc.stderr   # the choices are named
    for bare in ([], ["--help"]):
        proc = run(bare, tmp_path)
        assert proc.returncode == 0 and "demo" in proc.stdout and "bench" in proc.stdout
    proc = run(["--verbose"], tmp_path)
    assert proc.returncode == 2 and "give a command first" in proc.stderr


def test_bench_help_and_a_bad_option_answer_without_loading_the_ml_libraries(tmp_path):
    # the help must not wait for torch/peft/transformers (seconds of import on a laptop)
    probe = ("import sys\nfrom rapidfire_nb.cli import main\n"
             "try:\n    main(['bench', {args}])\nexcept SystemExit as e:\n    code = e.code\n"
             "heavy = sorted(m for m in ('torch', 'peft', 'transformers', 'trl') if m in sys.modules)\n"
             "print('EXIT', code, 'HEAVY', heavy)\n")
    for args, code in (("'--help'", 0), ("'--preset', 'nope'", 2)):
        proc = subprocess.run([sys.executable, "-c", probe.format(args=args)], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
        assert f"EXIT {code} HEAVY []" in proc.stdout, proc.stdout[-1500:] + proc.stderr[-1500:]


@pytest.mark.slow
def test_bench_says_how_long_it_takes_and_what_its_marks_mean(tmp_path, capsys):
    help_text = run(["bench", "--help"], tmp_path).stdout
    assert "about 4 minutes" in help_text and "[MISS] not met" in help_text
    from rapidfire_nb import bench

    assert bench.main(["--preset", "smoke", "--repeats", "1", "--eval", "none", "--no-memory", "--no-warmup"]) == 0
    out = capsys.readouterr().out
    assert "[MISS] not met on this machine" in out
    assert "below 1.0 is possible because" in out and "per-train() set-up" in out
