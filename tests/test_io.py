"""common/io.py writers: the file mode of new artifacts and text UTF-8 cannot encode."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from common.io import atomic_write_json, atomic_write_jsonl, atomic_write_text
from common.validation import InputError


@pytest.fixture
def umask():
    """Set the process umask for one test (and put the old one back)."""
    saved = os.umask(0o022)
    os.umask(saved)
    yield lambda mask: os.umask(mask)
    os.umask(saved)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("mask, expected", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_new_files_get_the_umask_mode_not_0600(tmp_path, umask, mask, expected):
    umask(mask)
    atomic_write_text(tmp_path / "a.md", "x\n")
    atomic_write_json(tmp_path / "b.json", {"a": 1})
    atomic_write_jsonl(tmp_path / "c.jsonl", [{"a": 1}])
    assert [_mode(tmp_path / name) for name in ("a.md", "b.json", "c.jsonl")] == [expected] * 3
    # Same as a file the user writes with plain open():
    with open(tmp_path / "plain.txt", "w") as handle:
        handle.write("x")
    assert _mode(tmp_path / "plain.txt") == expected


def test_a_replaced_file_keeps_its_mode(tmp_path, umask):
    umask(0o022)
    path = tmp_path / "selected.json"
    path.write_text("[]")
    path.chmod(0o640)
    atomic_write_json(path, [{"skill": "x"}])
    assert _mode(path) == 0o640 and json.loads(path.read_text()) == [{"skill": "x"}]
    assert [p.name for p in tmp_path.iterdir()] == ["selected.json"]  # no temporary file left


def test_json_writers_escape_a_lone_surrogate(tmp_path):
    atomic_write_json(tmp_path / "a.json", {"text": "half \ud800 pair"})
    atomic_write_jsonl(tmp_path / "a.jsonl", [{"text": "é \udfff"}])
    assert json.loads((tmp_path / "a.json").read_bytes().decode("utf-8")) == {"text": "half \ud800 pair"}
    assert json.loads((tmp_path / "a.jsonl").read_bytes().decode("utf-8")) == {"text": "é \udfff"}


def test_text_writer_refuses_a_lone_surrogate_and_writes_nothing(tmp_path):
    path = tmp_path / "prompt.md"
    with pytest.raises(InputError, match=r"prompt.md: cannot write: character '\\ud800' at position 5"):
        atomic_write_text(path, "abcd \ud800")
    assert list(tmp_path.iterdir()) == []


def test_current_umask_reads_the_umask_without_changing_it(umask):
    from common.io import current_umask

    umask(0o027)
    assert current_umask() == 0o027 and current_umask() == 0o027


def test_a_full_disk_keeps_the_previous_file_and_says_which_file_and_how_much(tmp_path, monkeypatch, capsys):
    """ENOSPC in the middle of a write (here at fsync, where a delayed-allocation file system reports it): the
    previous complete file stays, no temporary file is left, and the one line names the file and the bytes."""
    import errno

    from common import io as common_io
    from common.cli import cli_entry
    from common.io import NoSpaceError, atomic_write_json

    target = tmp_path / "results.json"
    atomic_write_json(target, {"tasks": 1})
    before = target.read_bytes()

    def full_disk(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(common_io.os, "fsync", full_disk)
    payload = {"tasks": list(range(1000))}
    with pytest.raises(NoSpaceError) as caught:
        atomic_write_json(target, payload)
    size = len(common_io._encode_json(json.dumps(payload, indent=2, ensure_ascii=False) + "\n"))
    assert str(target) in str(caught.value) and f"no space left to write {size:,} bytes" in str(caught.value)
    assert "its previous version is unchanged" in str(caught.value)
    assert target.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]

    @cli_entry
    def main(argv=None):
        atomic_write_json(tmp_path / "new.json", payload)
        return 0

    assert main([]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path / 'new.json'}: no space left") and err.count("\n") == 1
    assert "nothing was written" in err and not (tmp_path / "new.json").exists()


def _half_then_full(monkeypatch):
    """os.write in common.io writes half of what it is given once, then the disk is full."""
    import errno

    from common import io as common_io

    real_write = common_io.os.write
    calls = []

    def write(fd, data):
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data[:len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(common_io.os, "write", write)
    return calls


def test_an_appended_line_that_meets_a_full_disk_is_cut_back_to_the_last_whole_line(tmp_path, monkeypatch):
    """metrics.jsonl, the labeler's cache and the evaluation journal append lines: half a line written before the
    disk filled is removed again, and the error names the file and the bytes of the line."""
    from common.io import NoSpaceError, append_line

    path = tmp_path / "metrics.jsonl"
    append_line(path, '{"iteration": 1}\n')
    before = path.read_bytes()
    calls = _half_then_full(monkeypatch)
    line = json.dumps({"iteration": 2, "mean_reward": 0.5}) + "\n"
    with pytest.raises(NoSpaceError) as caught:
        append_line(path, line)
    assert len(calls) == 2  # half of the line went in before the failure
    assert path.read_bytes() == before
    assert f"{path}: no space left to write {len(line):,} bytes" in str(caught.value)
    assert "the file ends with its last whole line" in str(caught.value)


def test_an_appended_line_on_a_really_full_device_names_it(tmp_path):
    """/dev/full answers every write with ENOSPC (and cannot be cut back): the error still names it."""
    from common.io import NoSpaceError, append_line

    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    with pytest.raises(NoSpaceError) as caught:
        append_line("/dev/full", "abc\n")
    assert caught.value.strerror.startswith("/dev/full: no space left to write 4 bytes")


def test_a_staged_model_write_that_meets_a_full_disk_keeps_the_previous_files(tmp_path, monkeypatch):
    """The adapter, checkpoint, gate and SFT model writers stage their files and rename them in: a full disk
    while staging leaves the previous files and no staging folder, and says where and how much was needed;
    a folder with fewer bytes free than the weights is refused before anything is written."""
    import errno

    import safetensors.torch
    import torch

    from common import io as common_io
    from common.io import NoSpaceError
    from train.policy import write_peft_adapter

    class Config:
        def save_pretrained(self, folder):
            Path(folder, "adapter_config.json").write_text("{}")

    folder = tmp_path / "adapter"
    state = {"w": torch.zeros(4, 8)}
    write_peft_adapter(Config(), state, folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    with pytest.raises(NoSpaceError) as caught:
        write_peft_adapter(Config(), {"w": torch.ones(4, 8)}, folder)
    assert caught.value.strerror.startswith(f"{folder}: no space left to write 128 bytes")
    assert "the adapter files there are unchanged" in str(caught.value)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before  # no staging folder left either

    monkeypatch.undo()
    monkeypatch.setattr(common_io, "_free_bytes", lambda _folder: 100)
    with pytest.raises(NoSpaceError, match=r"no space left to write 128 bytes \(100 bytes free in "):
        write_peft_adapter(Config(), {"w": torch.ones(4, 8)}, folder)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_a_journal_cut_by_a_kill_takes_its_next_line_on_a_line_of_its_own(tmp_path):
    """A kill in the middle of a journal line leaves it without its newline: reopening cuts it, so the episodes
    written after it are read back (they used to be glued to the cut line, and the run after refused the file)."""
    from benchmarks.results_journal import ResultsJournal

    out = tmp_path / "results.json"
    with ResultsJournal(out, {"seed": 0}) as journal:
        journal.add((0, 0), {"reward": 1.0}, {"id": 0})
    path = Path(f"{out}.partial.jsonl")
    with open(path, "a", encoding="utf-8") as handle:
        handle.write('{"key": [1, 0], "simulation": {"rew')  # killed here
    with ResultsJournal(out, {"seed": 0}) as journal:
        assert sorted(journal.scored) == [(0, 0)]
        journal.add((1, 0), {"reward": 0.0}, {"id": 1})
    with ResultsJournal(out, {"seed": 0}) as journal:
        assert sorted(journal.scored) == [(0, 0), (1, 0)]
