"""The ``%rapidfire`` line magic: steer the kernel's current experiment from a cell.

    %load_ext rapidfire
    %rapidfire status                       # compact table of runs (and the Ray workers, if any)
    %rapidfire stop 2
    %rapidfire resume 2
    %rapidfire confirm 3     (pruner_mode="suggest": or ignore 3)
    %rapidfire delete 3
    %rapidfire clone 1 lr=5e-4 lora_dropout=0.05 --warm-start
    %rapidfire knobs 1                      # what a clone of run 1 may change
    %rapidfire end [NAME]                   # end the experiment(s) training in this kernel
    %rapidfire panel | tensorboard | results | help

Everything typed here is data, never code: values are read with ``json.loads`` and then
``ast.literal_eval`` (literals only), and a mistake prints one line naming it instead of a
traceback; a refused command changes nothing.
"""

from __future__ import annotations

import difflib
import sys
from pathlib import Path

from IPython.core.magic import Magics, line_magic, magics_class, no_var_expand

from rapidfire_nb.errors import RapidFireError
from rapidfire_nb.experiment_view import view_of
from rapidfire_nb.notebook.magic_args import MagicError, parse_clone, parse_run_id, split_args
from rapidfire_nb.notebook.status_text import (_fmt, queued_ops_line, status_table, worker_lines,
                                               worker_logs)

USAGE = """\
%rapidfire <command> [arguments]   (acts on the kernel's current Experiment)

  panel                         show the live control panel
  status                        compact table of the runs (best eval loss first once every
                                live run has one, as the panel; run order until then), the ops
                                still queued for the next chunk boundary; with Ray workers
                                (num_workers) also each worker, its node and device, the run it
                                trains and its log file
  stop ID                       stop a run at its next chunk boundary (its checkpoint stays)
  resume ID                     resume a stopped run from its checkpoint
  delete ID                     remove a run for good (its metrics stay, marked deleted)
  confirm ID                    pruner_mode="suggest": stop run ID as the pruner suggests
  ignore ID                     pruner_mode="suggest": keep run ID training (not judged again)
  clone ID key=value ... [--warm-start]
                                new run from run ID's config plus the changes; keys are dotted
                                (training_args.learning_rate) or short (learning_rate, lr) names
                                of the run's knobs; values are JSON or Python literals
                                (5e-4, 16, true, "cosine", ["q_proj","v_proj"]); --warm-start
                                starts from run ID's current weights and data position
  knobs ID                      the knobs a clone of run ID may change, with their values
  end [NAME]                    end the experiment NAME that trains in this kernel, or every
                                one that trains (without NAME; the current one if none does):
                                unfinished runs stop at their next chunk boundary as stopped
                                (resumable with Experiment(NAME, resume=True)), as exp.end(wait=False)
  tensorboard                   open TensorBoard on this experiment's logs
  results                       every logged metric (long form DataFrame)
  help                          this text"""

# -- the magic ---------------------------------------------------------------------------------

@magics_class
class RapidFireMagics(Magics):
    """``%rapidfire``: see ``USAGE``."""

    # no_var_expand: IPython would otherwise evaluate {expr} and $name in the line as code
    @no_var_expand
    @line_magic
    def rapidfire(self, line: str = ""):
        try:
            return self._dispatch(line)
        except MagicError as exc:
            _say_error(str(exc))
        except RapidFireError as exc:
            # refusals from the Experiment already say what was wrong
            _say_error(str(exc))
        except Exception as exc:  # a magic never shows a traceback; the message names the cause
            _say_error(f"{type(exc).__name__}: {exc}")
        return None

    def _dispatch(self, line: str):
        tokens = split_args(line or "")
        if not tokens or tokens[0] in ("help", "-h", "--help", "?"):
            if len(tokens) > 1:
                raise MagicError("'help' takes no arguments")
            print(USAGE)
            return None
        command, args = tokens[0], tokens[1:]
        handler = getattr(self, f"_cmd_{command}", None)
        if handler is None:
            close = difflib.get_close_matches(command, COMMANDS, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise MagicError(f"unknown command {command!r}{hint} (commands: {', '.join(COMMANDS)})")
        return handler(args)

    # each handler gets the tokens after the command name
    def _cmd_panel(self, args):
        _no_args("panel", args)
        from IPython.display import display

        display(_experiment().panel())

    def _cmd_status(self, args):
        _no_args("status", args)
        view = view_of(_experiment())
        name = view.name
        events_path = view.events_path
        if view.folder_given_back:
            # a new experiment whose run_fit was refused gave its folder back: nothing was lost
            print(f"experiment {name!r} has no runs yet: its last run_fit was refused (and left "
                  "no folder behind); fix the call and run it again")
            return None
        if events_path is not None and not events_path.exists():
            # the folder (or its log) was removed under the live Experiment: what memory holds is stale
            where = view.path if view.path is not None else events_path.parent
            print(f"experiment {name!r}: its folder {where} no longer exists (deleted?) or lost its "
                  "events.jsonl; nothing to show or continue", file=sys.stderr)
            return None
        table = status_table(view)
        statuses: list[str] = []
        if view.has_table:
            # ask the engine first, then read the table: never hold the table's lock while waiting
            # for the engine's (its loop holds that one while an AutoML hook reads the table)
            now = view.training_now(timeout=1.0)
            live = view.fit_started
            starting = view.workers_starting
            logs = worker_logs(view.events.since(0))
            lines, statuses = view.read_table(lambda t: (
                worker_lines(t, now, live=live and not t.get("ended"), starting=starting, logs=logs),
                [str(r.get("status")) for r in t["runs"].values()]))
            if lines:
                print("\n".join(lines))
        queued = queued_ops_line(view)
        if queued:
            print(queued)
        if statuses and not view.fit_started:
            # resume=True before run_fit: the log knows the runs (the table shows them), the
            # engine is not started
            open_ = sum(1 for st in statuses if st in ("pending", "running", "stopped"))
            counts = ", ".join(f"{statuses.count(st)} {st}" for st in dict.fromkeys(statuses))
            if open_:
                print(f"experiment {name!r} has {len(statuses)} run(s) in its log ({counts}); call "
                      "exp.run_fit(...) with the original arguments to continue them")
            else:
                print(f"experiment {name!r} has {len(statuses)} run(s) in its log, none left to "
                      f"train ({counts}); exp.get_results() and exp.get_runs_info() read them")
        elif len(table) == 0:
            print(f"experiment {name!r} has no runs yet (call exp.run_fit(...))")
        if len(table) == 0:
            return None
        return table

    def _cmd_stop(self, args):
        rid = _one_id("stop", args)
        _experiment().stop(rid)
        print(f"run {rid}: stop requested (takes effect at its next chunk boundary)")

    def _cmd_resume(self, args):
        rid = _one_id("resume", args)
        _experiment().resume(rid)
        print(f"run {rid}: resumed (continues from its checkpoint)")

    def _cmd_delete(self, args):
        rid = _one_id("delete", args)
        _experiment().delete(rid)
        print(f"run {rid}: deleted (its metrics stay, marked deleted)")

    def _cmd_confirm(self, args):
        rid = _one_id("confirm", args)
        stopped = _experiment().apply_suggestions([rid])
        print(f"run {rid}: stop requested as the pruner suggested" if stopped else
              f"run {rid}: it ended before the confirm; nothing to stop")

    def _cmd_ignore(self, args):
        rid = _one_id("ignore", args)
        ignored = _experiment().dismiss_suggestions([rid])
        print(f"run {rid}: suggestion ignored; it trains on and is not judged again" if ignored else
              f"run {rid}: it ended before the answer; nothing to ignore")

    def _cmd_clone(self, args):
        exp = _experiment()
        run_id, changes, warm = parse_clone(args, exp.editable_knobs)
        new_id = exp.clone_modify(run_id, changes, warm_start=warm)
        desc = ", ".join(f"{k.rsplit('.', 1)[-1] if k.count('.') == 1 else k}={_fmt(v)}"
                         for k, v in changes.items())
        how = "warm start from its current weights" if warm else "cold start"
        print(f"run {new_id}: clone of run {run_id} with {desc} ({how})")

    def _cmd_knobs(self, args):
        rid = _one_id("knobs", args)
        knobs = _experiment().editable_knobs(rid)
        width = max((len(k) for k in knobs), default=0)
        print(f"knobs of run {rid} (change them with %rapidfire clone {rid} key=value ...):")
        for k, v in knobs.items():
            print(f"  {k.ljust(width)}  {_fmt(v)}")

    def _cmd_end(self, args):
        from rapidfire_nb.session import current_experiment, end_training, open_experiment, training_experiments

        if len(args) > 1:
            raise MagicError(f"'end' takes at most one experiment name, got {' '.join(args)!r}")
        name = args[0] if args else None
        training = training_experiments()
        if name is not None and name not in training:
            exp = open_experiment(name)
            current = current_experiment()
            if exp is None and current is not None and current.name == name:
                exp = current   # e.g. a new experiment whose run_fit was refused (it holds no folder)
            if exp is not None:
                exp.end(wait=False)
                print(f"experiment {name!r}: closed (nothing was training)")
                return None
            known = ", ".join(repr(n) for n in training) or "none"
            raise MagicError(f"no experiment {name!r} trains in this kernel (training: {known})")
        ended = end_training(name)
        if not ended:
            exp = current_experiment()
            if exp is None:
                raise MagicError("no experiment in this kernel trains or is open; nothing to end")
            # open, but nothing trains: closing it stops nothing (it may never have had runs)
            exp.end(wait=False)
            print(f"experiment {exp.name!r}: closed (nothing was training)")
            return None
        for n in ended:
            print(f"experiment {n!r}: ended; unfinished runs stopped at their chunk boundary "
                  f"(Experiment({n!r}, resume=True) and the same run_fit continue them)")
        return None

    def _cmd_tensorboard(self, args):
        _no_args("tensorboard", args)
        return _experiment().tensorboard()

    def _cmd_results(self, args):
        _no_args("results", args)
        return _experiment().get_results()


COMMANDS = ["panel", "status", "stop", "resume", "delete", "confirm", "ignore", "clone", "knobs", "end",
            "tensorboard", "results", "help"]


def _say_error(message: str) -> None:
    # one line: the cause, never a traceback
    print(f"%rapidfire: {' '.join(message.split())}", file=sys.stderr)


def _no_args(command: str, args: list[str]) -> None:
    if args:
        raise MagicError(f"'{command}' takes no arguments, got {' '.join(args)!r}")


def _one_id(command: str, args: list[str]) -> int:
    if len(args) > 1:
        raise MagicError(f"'{command}' takes one run id, got {' '.join(args)!r}")
    return parse_run_id(args[0] if args else None, command)


def _experiment():
    from rapidfire_nb.session import current_experiment

    exp = current_experiment()
    if exp is None:
        hint = _resume_hint()
        raise MagicError("no experiment in this kernel: create one with "
                         "exp = Experiment('name') and call exp.run_fit(...)" + hint)
    return exp


def _resume_hint(parent: Path = Path("rapidfire_experiments")) -> str:
    """After a kernel restart the experiment is still on disk: name the newest one in the default
    folder and the call that continues it (a bare Experiment('name') would start another)."""
    try:
        logs = [p for p in parent.glob("*/events.jsonl") if p.is_file()]
        newest = max(logs, key=lambda p: p.stat().st_mtime).parent.name if logs else None
    except OSError:
        return ""
    if newest is None:
        return ""
    return (f"; after a kernel restart, Experiment({newest!r}, resume=True) and the same "
            f"run_fit(...) continue {newest!r} from its last chunk boundary")


def load_ipython_extension(ipython) -> None:
    """``%load_ext rapidfire`` (or ``rapidfire_nb``): register ``%rapidfire``."""
    from rapidfire_nb._quiet import import_peft_quietly

    import_peft_quietly()
    ipython.register_magics(RapidFireMagics)


def unload_ipython_extension(ipython) -> None:
    line_magics = ipython.magics_manager.magics.get("line", {})
    line_magics.pop("rapidfire", None)
    ipython.magics_manager.registry.pop("RapidFireMagics", None)
