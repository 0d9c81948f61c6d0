"""graft.storage.files: files others can read, as the umask says; a folder written whole or not
at all."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import save_file

from graft.storage.files import atomic_folder, current_umask, share_like_umask


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_the_umask_is_read_without_changing_it(umask_022):
    assert current_umask() == 0o022
    assert current_umask() == 0o022


def test_a_weights_file_written_0600_becomes_readable_by_others(tmp_path, umask_022):
    folder = tmp_path / "donor"
    (folder / "sub").mkdir(parents=True)
    save_file({"w": torch.zeros(2)}, str(folder / "model.safetensors"))
    (folder / "sub" / "config.json").write_text("{}")
    (folder / "link").symlink_to(folder / "model.safetensors")
    # the writer's own mode, whatever the umask: what a second user could not read
    assert (folder / "model.safetensors").stat().st_mode & 0o777 == 0o600
    folder.chmod(0o700)  # as tempfile.mkdtemp makes it
    share_like_umask(folder)
    assert (folder / "model.safetensors").stat().st_mode & 0o777 == 0o644
    assert (folder / "sub" / "config.json").stat().st_mode & 0o777 == 0o644
    assert folder.stat().st_mode & 0o777 == 0o755
    os.umask(0o077)  # a private workspace stays private
    share_like_umask(folder)
    assert (folder / "model.safetensors").stat().st_mode & 0o777 == 0o600


def test_a_folder_is_written_whole_or_not_at_all(tmp_path, umask_022):
    out = tmp_path / "data" / "set"
    with atomic_folder(out) as tmp:
        assert tmp.parent == out.parent and not out.exists()
        (tmp / "a.txt").write_text("one")
    assert (out / "a.txt").read_text() == "one"
    assert out.stat().st_mode & 0o777 == 0o755  # not mkdtemp's 0700
    # a failed rewrite leaves the folder as it was, and no temp folder beside it
    with pytest.raises(RuntimeError), atomic_folder(out) as tmp:
        (tmp / "b.txt").write_text("two")
        raise RuntimeError("interrupted")
    assert sorted(p.name for p in out.iterdir()) == ["a.txt"]
    # a finished rewrite replaces it whole: nothing of the old folder stays
    with atomic_folder(out) as tmp:
        (tmp / "b.txt").write_text("two")
    assert sorted(p.name for p in out.iterdir()) == ["b.txt"]
    assert [p.name for p in out.parent.iterdir()] == ["set"]
