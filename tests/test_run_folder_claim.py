"""One folder, one run (common/run_folder.py: claimed_run_folder): a second process on a folder in use is refused
at once naming the holder, a stale lock is taken over with a line saying whose it was, a new run refuses another
run's files unless --overwrite, and an interrupted --overwrite of a command that cannot resume loses nothing."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from common.run_folder import LOCK_NAME, SET_ASIDE_NAME, claimed_run_folder
from common.validation import InputError

REPO = Path(__file__).resolve().parents[1]

HOLDER = """
import sys
from common.run_folder import claimed_run_folder
with claimed_run_folder(sys.argv[1], "--output_dir", fresh=False, command="python -m train --game g"):
    print("held", flush=True)
    sys.stdin.read()  # hold the folder until the test closes our stdin
"""


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_second_process_on_a_folder_in_use_is_refused_at_once_naming_the_holder(tmp_path):
    folder = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], cwd=REPO, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(InputError) as refused:
            with claimed_run_folder(folder, "--output_dir", fresh=False):
                pytest.fail("two processes held one run folder")
        message = str(refused.value)
        assert f"--output_dir {folder} is in use by another run (pid {holder.pid}, `python -m train --game g`" in message
        assert "give --output_dir another folder" in message
    finally:
        holder.communicate("", timeout=60)
    assert holder.returncode == 0
    assert not (folder / LOCK_NAME).exists()  # released: the next run gets it
    with claimed_run_folder(folder, "--output_dir", fresh=False):
        assert json.loads((folder / LOCK_NAME).read_text())["pid"] == os.getpid()


def test_a_holder_killed_outright_leaves_a_lock_the_next_run_takes_over_saying_so(tmp_path, capsys):
    folder = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], cwd=REPO, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    holder.kill()  # SIGKILL: no cleanup, the lock file stays; the kernel drops the flock
    holder.wait(timeout=60)
    assert (folder / LOCK_NAME).exists()
    with claimed_run_folder(folder, "--output_dir", fresh=False):
        pass
    err = capsys.readouterr().err
    assert (f"--output_dir {folder}: taking over the lock left by pid {holder.pid}, `python -m train --game g`"
            in err) and "(no longer running)" in err


def test_a_new_run_refuses_another_runs_files_and_overwrite_replaces_them(tmp_path, capsys):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "metrics.jsonl").write_text('{"iteration": 1}\n{"iteration": 2}\n')
    (folder / "checkpoints").mkdir()
    with pytest.raises(InputError, match=r"holds another run's files \(checkpoints, metrics.jsonl\); pass --resume "
                                         r"RUN to continue it, pass --overwrite to replace it"):
        with claimed_run_folder(folder, "--output_dir", fresh=True, continue_hint="pass --resume RUN to continue it"):
            pytest.fail("a new run started over another run's files")
    assert sorted(_files(folder)) == ["metrics.jsonl"]  # nothing touched
    with claimed_run_folder(folder, "--output_dir", fresh=False):  # a resume continues them
        pass
    with claimed_run_folder(folder, "--output_dir", fresh=True, overwrite=True):
        assert sorted(p.name for p in folder.iterdir()) == [LOCK_NAME]  # the old run is gone before the new writes
        (folder / "metrics.jsonl").write_text('{"iteration": 1}\n')
    assert _files(folder) == {"metrics.jsonl": b'{"iteration": 1}\n'}  # not 1, 2, 1
    assert "--overwrite removed the previous run (2 entries)" in capsys.readouterr().err


def test_an_interrupted_overwrite_of_a_command_that_cannot_resume_puts_the_old_run_back(tmp_path):
    folder = tmp_path / "gate"
    folder.mkdir()
    (folder / "gate.safetensors").write_bytes(b"old gate")
    (folder / "sft_metrics.jsonl").write_text("old\n")
    before = _files(folder)
    with pytest.raises(KeyboardInterrupt):
        with claimed_run_folder(folder, "output_dir", fresh=True, overwrite=True, restore_on_failure=True):
            assert sorted(p.name for p in folder.iterdir()) == sorted([LOCK_NAME, SET_ASIDE_NAME])
            (folder / "sft_metrics.jsonl").write_text("new epoch 1\n")
            raise KeyboardInterrupt
    assert _files(folder) == before
    with claimed_run_folder(folder, "output_dir", fresh=True, overwrite=True, restore_on_failure=True):
        (folder / "gate.safetensors").write_bytes(b"new gate")
    assert _files(folder) == {"gate.safetensors": b"new gate"}


def test_an_overwrite_killed_outright_is_undone_by_the_next_claim(tmp_path, capsys):
    folder = tmp_path / "gate"
    (folder / SET_ASIDE_NAME).mkdir(parents=True)  # what a SIGKILL-ed --overwrite run leaves
    (folder / SET_ASIDE_NAME / "gate.safetensors").write_bytes(b"old gate")
    (folder / "gate.safetensors").write_bytes(b"half of a new gate")
    with pytest.raises(InputError, match="holds another run's files"):
        with claimed_run_folder(folder, "output_dir", fresh=True):
            pass
    assert _files(folder) == {"gate.safetensors": b"old gate"}
    assert "put back the previous run's 1 entries, which a killed --overwrite run had set aside" in \
        capsys.readouterr().err


def test_only_rank_0_claims_under_torchrun(tmp_path, monkeypatch):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "metrics.jsonl").write_text("rank 0 wrote this\n")
    monkeypatch.setenv("RANK", "1")
    with claimed_run_folder(folder, "--output_dir", fresh=True):  # rank 0 made the checks
        assert not (folder / LOCK_NAME).exists()
