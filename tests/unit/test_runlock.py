"""The run-directory lock and the ``--nproc`` relaunch command, without launching any training."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from finetune_cli.engine.launch import torchrun_command, without_nproc
from finetune_cli.errors import RunDirError
from finetune_cli.rundir import LOCK, RunDir, RunLock

HOLD = "import sys, time; from finetune_cli.rundir import RunLock; RunLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(60)"


def test_a_held_lock_refuses_with_the_holders_pid_and_a_dead_holders_lock_is_taken_over(tmp_path):
    run = tmp_path / "run"
    child = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        with pytest.raises(RunDirError) as e:
            RunLock(run).acquire()
        assert f"in use by another finetune run (PID {child.pid} on " in str(e.value) and "\n" not in str(e.value)
        assert e.value.exit_code == 2
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    lock = RunLock(run).acquire()  # the kernel dropped the dead holder's flock
    try:
        assert lock.took_over is not None and lock.took_over.split()[0] == str(child.pid)
        with pytest.raises(RunDirError, match=f"PID {os.getpid()} "):  # even this process cannot take it twice
            RunLock(run).acquire()
    finally:
        lock.release()
    RunLock(run).acquire().release()  # released: free again


def test_overwrite_keeps_the_lock_and_the_lock_alone_is_an_empty_directory(tmp_path, tiny_recipe):
    from finetune_cli.pipelines.recipes import load_recipe

    recipe = load_recipe(None, tiny_recipe())
    run = recipe.run_dir
    lock = RunLock(run).acquire()
    try:
        assert RunDir(run).claim(recipe, overwrite=False) is False  # only the lock file: a new run
        (run / "junk").mkdir()
        (run / "junk.txt").write_text("x")
        with pytest.raises(RunDirError, match="holds no finetune run"):
            RunDir(run).claim(recipe, overwrite=False)
        assert RunDir(run).claim(recipe, overwrite=True) is False
        assert sorted(p.name for p in run.iterdir()) == [LOCK]
        with pytest.raises(RunDirError, match="in use"):
            RunLock(run).acquire()
    finally:
        lock.release()


def test_nproc_relaunch_command():
    assert without_nproc(["train", "-r", "x", "--nproc", "2", "a=1", "--nproc=3", "--device", "cpu"]) == \
        ["train", "-r", "x", "a=1", "--device", "cpu"]
    cmd = torchrun_command(2, ["train", "--nproc", "2", "-r", "x"], "/nonexistent/bin/finetune")
    assert cmd[1:] == ["-m", "finetune_cli.engine.launch", "--standalone", "--nproc_per_node=2",
                       "-m", "finetune_cli", "train", "-r", "x"]
    import finetune_cli

    main = os.path.join(os.path.dirname(finetune_cli.__file__), "__main__.py")
    assert torchrun_command(2, ["train"], main)[5:7] == ["-m", "finetune_cli"]
    assert torchrun_command(2, ["train"], __file__)[5] == __file__  # a script reruns itself


def test_launcher_verdict_is_the_line_that_explains_the_run():
    """``finetune train --nproc``'s launcher prints one worker's line: a worker's own error before the
    consequences on the others (stopped: 130, lost peer: 6); a worker killed without a word is a
    lost process (6), named; else the peers' report, else the interruption."""
    from finetune_cli.engine.launch import verdict

    data, lost, stop = (2, "error in data.tsv row 3"), (6, "process 0 of 3: another process …"), (130, "interrupted")
    assert verdict({0: stop, 1: data, 2: data}, {0: 130, 1: 2, 2: 2}, 3) == data
    assert verdict({0: lost, 2: (3, "loss is nan")}, {0: 6, 1: -9, 2: 3}, 3) == (3, "loss is nan")
    code, line = verdict({0: lost}, {0: 6, 1: -9}, 2)
    assert code == 6 and line.startswith("process 1 of 2 was killed by SIGKILL")
    assert verdict({0: lost, 1: stop}, {0: 6, 1: 130}, 2) == lost
    # rank 0 stopped by the agent (SIGTERM) before it could write a report: rank 1's death is the cause
    code, line = verdict({}, {0: -15, 1: -9}, 2)
    assert code == 6 and line.startswith("process 1 of 2 was killed by SIGKILL")
    assert verdict({}, {0: -15, 1: 3}, 2)[1].startswith("process 1 of 2 exited with code 3")
    assert verdict({}, {0: -15, 1: -15}, 2)[1].startswith("process 0 of 2 was killed by SIGTERM")
    assert verdict({0: stop, 1: stop}, {}, 2) == stop  # the launcher itself was stopped: no exits


def test_sigterm_before_training_exits_130(tmp_path):
    """SIGTERM outside the training loop (a worker still loading) ends the command like Ctrl-C,
    exit 130 and one line, not Python's death by signal (-15)."""
    code = ("import os, signal, time, typer\n"
            "from finetune_cli.cli.common import handle_errors\n"
            "@handle_errors\n"
            "def cmd():\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    time.sleep(30)\n"
            "typer.run(cmd)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "CI": "1"})
    assert res.returncode == 130 and res.stderr.strip() == "error: interrupted", res.stderr


def test_stop_requests_agree_and_escalate_only_in_one_process():
    from finetune_cli.engine.distributed import Processes, StopRequests

    stop = StopRequests(Processes())
    with stop.installed():
        assert not stop.agreed()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert stop.agreed()  # a flag, not an exception
        with pytest.raises(KeyboardInterrupt):  # the second signal stops at once
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
    assert signal.getsignal(signal.SIGTERM) is not stop._handler  # handlers restored


def test_another_ranks_write_probe_does_not_make_the_run_dir_look_used(tmp_path):
    """A 2-process start: rank 1's writability probe (a temp file) may exist while the main process
    checks the run directory; it must neither count as content nor block the run."""
    from finetune_cli.errors import RunDirError
    from finetune_cli.fsutil import WRITE_TEST_PREFIX
    from finetune_cli.pipelines.recipes import load_recipe
    from finetune_cli.rundir import RunDir

    run_dir = tmp_path / "runs" / "x"
    run_dir.mkdir(parents=True)
    (run_dir / f"{WRITE_TEST_PREFIX}abc.tmp").write_text("")
    recipe = load_recipe("quickstart", [f"output.dir={tmp_path / 'runs'}", "output.name=x"])
    assert RunDir(run_dir).claim(recipe, overwrite=False) is False
    (run_dir / "stray.txt").write_text("")  # a real stranger still blocks
    with pytest.raises(RunDirError, match="not empty and holds no finetune run"):
        RunDir(run_dir).claim(recipe, overwrite=False)


def _train(tiny_recipe):
    from typer.testing import CliRunner

    from finetune_cli.cli.main import app

    return CliRunner().invoke(app, ["train", "-r", "quickstart", *tiny_recipe(), "--device", "cpu"])


def test_only_a_holder_that_died_is_taken_over(tiny_recipe, tmp_path):
    """A clean finish empties the lock file, so a rerun has no one to take over from; a holder
    killed with SIGKILL leaves its name, and the next run says whose lock it took."""
    run = tmp_path / "runs" / "tiny"
    first = _train(tiny_recipe)
    assert first.exit_code == 0, first.output
    again = _train(tiny_recipe)
    assert again.exit_code == 0 and "already complete" in again.stderr, again.output
    assert "taking over" not in again.stderr
    assert (run / LOCK).read_text() == ""  # released cleanly: no holder named

    child = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    after_kill = _train(tiny_recipe)
    assert after_kill.exit_code == 0, after_kill.output
    assert f"taking over {run / LOCK}: its holder ({child.pid} " in after_kill.stderr
    assert "is no longer running" in after_kill.stderr


def test_a_symlinked_lock_file_is_refused_and_its_target_untouched(tiny_recipe, tmp_path):
    run = tmp_path / "runs" / "tiny"
    run.mkdir(parents=True)
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me\n")
    (run / LOCK).symlink_to(outside)
    res = _train(tiny_recipe)
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "symbolic link" in lines[0], res.stderr
    assert outside.read_text() == "keep me\n"
    assert sorted(p.name for p in run.iterdir()) == [LOCK]  # nothing written beside the link

    dangling = tmp_path / "other"
    dangling.mkdir()
    (dangling / LOCK).symlink_to(tmp_path / "would-be-created")
    with pytest.raises(RunDirError, match="symbolic link"):
        RunLock(dangling).acquire()
    assert not (tmp_path / "would-be-created").exists()  # O_CREAT did not follow the link
